"""Fan-out holds, measured: N requests at once with the same new prefix and their own last
user message, through the proxy with holds on and off, against the simulator (vLLM V1's
cache semantics), the simulator with an engine that shares a block only once computed
(tests/support/late_cache.py) and real vLLM.

For each engine and arrival (``idle``: the engine has nothing else to do; ``busy``: a long
request is running on it when the fan-out arrives, so the fan-out queues and is scheduled
together), runs with holds on and off alternate, each with a new prefix on an engine whose
prefix cache was just reset (``POST /reset_prefix_cache``). Reported per
setting, medians over the runs: the engine's prefill tokens (sum over the N requests of
prompt - cached tokens, as usage reports them), the same from the engine's own
``vllm:prompt_tokens_by_source_total{source="local_compute"}`` (the blocking request's
share taken out), TTFT p50 and max as the clients see them (a hold included), and the
fan-out's wall time.

``--traces`` instead replays agent traces through the proxy in front of the simulator
(which streams each recorded reply back) and prints the round-trip metrics the proxy
observed, next to the same figures counted straight from the traces: the simulator
replays what the recorded model did, so they are the traces' own figures.

A measurement, not a test. Run from the repository root:
``.venv/bin/python -m tests.benchmarks.fanout --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from proxy import config
from proxy.app import create_app
from proxy.replay import traces
from proxy.replay.runner import Options, Replayer, make_client
from proxy.sim.app import create_sim_app
from proxy.sim.config import SimConfig
from tests.support.fanout_load import Result, busy_engine, fan_out, fan_out_bodies
from tests.support.late_cache import late_cache_sim_app
from tests.support.servers import serve

ENGINES = ("sim", "late-sim", "vllm")
COMPUTED = "vllm:prompt_tokens_by_source_total{"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="sim,late-sim", help=f"of {','.join(ENGINES)}")
    parser.add_argument("--vllm-url", help="a running vLLM (tests/vllm/serve.sh); else started")
    parser.add_argument("--vllm-model", default="tiny-qwen2")
    parser.add_argument("--arrivals", default="idle,busy", help="idle, busy or both")
    parser.add_argument("--n", type=int, default=8, help="requests in the fan-out")
    parser.add_argument("--prefix-words", type=int, default=4000, help="~tokens shared")
    parser.add_argument("--busy-words", type=int, default=6000, help="the blocking request")
    parser.add_argument("--repeats", type=int, default=3, help="runs per setting")
    parser.add_argument("--hold", type=float, default=10.0, help="fanout_hold when on")
    parser.add_argument("--sim-speed", type=float, default=1.0)
    parser.add_argument(
        "--sim-batched-tokens", type=int, default=8192, help="the simulators' step budget"
    )
    parser.add_argument("--seed", type=int, default=0, help="offsets every prompt's seed")
    parser.add_argument("--traces", type=Path, help="replay these instead (round trips)")
    parser.add_argument("--concurrency", type=int, default=4, help="with --traces")
    parser.add_argument("--json", type=Path, help="write the runs here")
    return parser.parse_args(argv)


@contextlib.contextmanager
def engine(name: str, args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """(base URL, model name) of a running engine of that kind."""
    if name in ("sim", "late-sim"):
        sim_config = SimConfig(speed=args.sim_speed, max_num_batched_tokens=args.sim_batched_tokens)
        build = late_cache_sim_app if name == "late-sim" else create_sim_app
        with serve(build(sim_config, registry=CollectorRegistry())) as url:
            yield url, sim_config.model_name
    elif args.vllm_url:
        yield args.vllm_url.rstrip("/"), args.vllm_model
    else:
        from tests.support import vllm

        log = Path(tempfile.mkdtemp()) / "vllm.log"
        with vllm.start(vllm.free_port(), log) as server:
            yield server.base_url, server.model


@contextlib.contextmanager
def proxy(upstream: str, hold: float) -> Iterator[tuple[str, CollectorRegistry]]:
    registry = CollectorRegistry()
    settings = config.load({"upstream": upstream, "fanout_hold": hold}, environ={})
    with serve(create_app(settings, registry=registry)) as url:
        yield url, registry


async def reset_cache(url: str) -> None:
    """Start each run cold: POST /reset_prefix_cache (the simulator; vLLM with
    VLLM_SERVER_DEV_MODE=1, as tests/vllm/serve.sh runs it)."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        response = await client.post("/reset_prefix_cache")
    if response.status_code != 200:
        raise RuntimeError(f"{url}/reset_prefix_cache answered {response.status_code}")


async def engine_computed(url: str) -> float | None:
    """Prompt tokens the engine computed so far (its own counter), if it exports one."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        text = (await client.get("/metrics")).text
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(COMPUTED) and 'source="local_compute"' in line
    ]
    return sum(values) if values else None


async def one_run(
    engine_url: str, proxy_url: str, model: str, args: argparse.Namespace, seed: int, busy: bool
) -> dict[str, Any]:
    bodies = fan_out_bodies(args.n, args.prefix_words, seed, model)
    await reset_cache(engine_url)
    before = await engine_computed(engine_url)
    blocker: list[Result] = []
    if busy:
        async with busy_engine(engine_url, model, args.busy_words, seed + 7919) as blocker:
            started = time.perf_counter()
            results = await fan_out(proxy_url, bodies)
            wall = time.perf_counter() - started
    else:
        started = time.perf_counter()
        results = await fan_out(proxy_url, bodies)
        wall = time.perf_counter() - started
    after = await engine_computed(engine_url)
    failed = [r.status for r in results if r.status != 200]
    if failed:
        raise RuntimeError(f"fan-out requests failed: {failed}")
    ttfts = [r.ttft_s for r in results if r.ttft_s is not None]
    engine_side = None
    if before is not None and after is not None:
        engine_side = after - before - sum(r.computed for r in blocker)
    return {
        "prompt_tokens": results[0].prompt_tokens,
        "computed": sum(r.computed for r in results),
        "engine_computed": engine_side,
        "ttft_p50_s": statistics.median(ttfts) if ttfts else None,
        "ttft_max_s": max(ttfts) if ttfts else None,
        "wall_s": wall,
    }


def holds(registry: CollectorRegistry) -> tuple[int, int]:
    def get(outcome: str) -> int:
        value = registry.get_sample_value("prefill_proxy_fanout_holds_total", {"outcome": outcome})
        return int(value or 0)

    return get("released"), get("timeout")


async def measure_engine(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    with (
        engine(name, args) as (engine_url, model),
        proxy(engine_url, args.hold) as (on_url, on_registry),
        proxy(engine_url, 0) as (off_url, _),
    ):
        seed = args.seed + 1000 * (ENGINES.index(name) + 1)
        for arrival in args.arrivals.split(","):
            runs: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
            held_before = holds(on_registry)
            for _ in range(args.repeats):
                for mode, url in (("on", on_url), ("off", off_url)):
                    seed += 1
                    runs[mode].append(
                        await one_run(engine_url, url, model, args, seed, arrival == "busy")
                    )
            released, timeout = (
                a - b for a, b in zip(holds(on_registry), held_before, strict=True)
            )
            for mode in ("on", "off"):
                rows.append(
                    {
                        "engine": name,
                        "arrival": arrival,
                        "holds": mode,
                        "runs": runs[mode],
                        "held": (released, timeout) if mode == "on" else (0, 0),
                    }
                )
                print(row_text(rows[-1]), file=sys.stderr, flush=True)
    return rows


def median_of(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [run[key] for run in runs if run[key] is not None]
    return statistics.median(values) if values else None


def _num(value: float | None, scale: float = 1.0) -> str:
    return "n/a" if value is None else f"{value * scale:,.0f}"


HEADER = (
    "| engine | arrival | holds | prompt tokens (1 req) | prefill tokens, usage | "
    "prefill tokens, engine metric | TTFT p50 ms | TTFT max ms | wall ms | held "
    "(released/timeout) |\n|---|---|---|---|---|---|---|---|---|---|"
)


def row_text(row: dict[str, Any]) -> str:
    runs = row["runs"]
    released, timeout = row["held"]
    return (
        f"| {row['engine']} | {row['arrival']} | {row['holds']} "
        f"| {_num(median_of(runs, 'prompt_tokens'))} | {_num(median_of(runs, 'computed'))} "
        f"| {_num(median_of(runs, 'engine_computed'))} "
        f"| {_num(median_of(runs, 'ttft_p50_s'), 1000)} "
        f"| {_num(median_of(runs, 'ttft_max_s'), 1000)} "
        f"| {_num(median_of(runs, 'wall_s'), 1000)} | {released}/{timeout} |"
    )


# --- round trips on the traces ---------------------------------------------------------


def trace_figures(conversations: list[traces.Conversation]) -> dict[str, float]:
    """Tool calls per step and steps per user turn, counted straight from the traces."""
    calls: list[int] = []
    turns: list[int] = []
    for conversation in conversations:
        for step in traces.steps(conversation):
            count = len(step.reply.get("tool_calls") or [])
            if count:
                calls.append(count)
            else:
                steps = 1 + sum(
                    1
                    for message in step.messages[_last_user(step.messages) + 1 :]
                    if message.get("role") == "assistant"
                )
                turns.append(steps)
    return {
        "steps_with_calls": len(calls),
        "tool_calls": sum(calls),
        "multi_call_steps": sum(1 for c in calls if c > 1),
        "turns": len(turns),
        "turn_steps": sum(turns),
    }


def _last_user(messages: list[dict[str, Any]]) -> int:
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    return users[-1] if users else -1


def proxy_figures(registry: CollectorRegistry) -> dict[str, float]:
    """The same figures from the proxy's round-trip histograms."""

    def get(name: str, **labels: str) -> float:
        return registry.get_sample_value(f"prefill_proxy_{name}", labels) or 0.0

    steps = get("tool_calls_per_step_count")
    return {
        "steps_with_calls": steps,
        "tool_calls": get("tool_calls_per_step_sum"),
        "multi_call_steps": steps - get("tool_calls_per_step_bucket", le="1.0"),
        "turns": get("steps_per_user_turn_count"),
        "turn_steps": get("steps_per_user_turn_sum"),
    }


async def replay_traces(args: argparse.Namespace) -> dict[str, Any]:
    conversations = traces.load(args.traces)
    sim_config = SimConfig(speed=100.0)
    registry = CollectorRegistry()
    with serve(create_sim_app(sim_config, registry=CollectorRegistry())) as sim_url:
        settings = config.load({"upstream": sim_url, "parallel_tool_calls": True}, environ={})
        with serve(create_app(settings, registry=registry)) as proxy_url:
            async with make_client(args.concurrency, 600) as client:
                options = Options(sim_config.model_name, concurrency=args.concurrency)
                run = await Replayer(client, proxy_url, options).run(conversations)
    return {
        "conversations": len(conversations),
        "steps": len(run.steps),
        "errors": sum(1 for r in run.steps if r.error),
        "proxy": proxy_figures(registry),
        "traces": trace_figures(conversations),
        "holds": holds(registry),
    }


def print_round_trips(result: dict[str, Any]) -> None:
    print(
        f"Replay of {result['conversations']} conversations, {result['steps']} steps "
        f"({result['errors']} failed), through the proxy (parallel_tool_calls on) in front "
        "of the simulator replaying the recorded replies.\n"
    )
    print("| figure | proxy metric | counted from the traces |\n|---|---|---|")
    proxy_side, trace_side = result["proxy"], result["traces"]

    def both(label: str, a: float, b: float, digits: int = 0) -> None:
        print(f"| {label} | {a:.{digits}f} | {b:.{digits}f} |")

    both("steps with tool calls", proxy_side["steps_with_calls"], trace_side["steps_with_calls"])
    both("tool calls in them", proxy_side["tool_calls"], trace_side["tool_calls"])
    both("steps with 2+ calls", proxy_side["multi_call_steps"], trace_side["multi_call_steps"])
    for side in (proxy_side, trace_side):
        side["calls_mean"] = side["tool_calls"] / max(side["steps_with_calls"], 1)
        side["turn_mean"] = side["turn_steps"] / max(side["turns"], 1)
    both("tool calls per step, mean", proxy_side["calls_mean"], trace_side["calls_mean"], 3)
    both("user turns ended", proxy_side["turns"], trace_side["turns"])
    both("steps per user turn, mean", proxy_side["turn_mean"], trace_side["turn_mean"], 3)
    released, timeout = result["holds"]
    print(f"\nFan-out holds during the replay: {released} released, {timeout} timed out.")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.traces is not None:
        result = asyncio.run(replay_traces(args))
        print_round_trips(result)
        if args.json:
            args.json.write_text(json.dumps(result, indent=2))
        return 0
    rows: list[dict[str, Any]] = []
    for name in args.engines.split(","):
        if name not in ENGINES:
            raise SystemExit(f"unknown engine {name!r}; choose from {', '.join(ENGINES)}")
        rows += asyncio.run(measure_engine(name, args))
    print(
        f"N={args.n} requests at once, ~{args.prefix_words} shared words, hold "
        f"{args.hold:g} s when on, {args.repeats} runs per row (medians)\n"
    )
    print(HEADER)
    for row in rows:
        print(row_text(row))
    if args.json:
        record = {"args": vars(args), "rows": rows}
        args.json.write_text(json.dumps(record, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
