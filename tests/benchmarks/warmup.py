"""Speculative prefill on the dev traces: TTFT of the steps that follow tool calls, with
the proxy's warm-up on and off, on a simulator small enough that sessions evict each other.

Each mode gets a fresh simulator and a fresh proxy (child processes, as deployed); the
conversations are replayed through the proxy with a tool latency before every step that
answers tool results. The table compares those steps' TTFT (client side), the engine's
computed prompt tokens (its own counter, warm-ups included) and what the warm-ups cost.

    .venv/bin/python -m tests.benchmarks.warmup      # 60 conversations, ~5 minutes

The defaults (24 conversations at once, 5 s tool rounds, 40k tokens of KV where those 24
hold ~60k: three shared system prompts and tools of ~4.3k, ~2k of their own on average)
lose the prefix of about half the steps after tool calls without warm-ups. Steps whose
computed tokens exceed COLD_TOKENS count as prefix lost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import re
import sys
import threading
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from proxy.background import free_port, spawn
from proxy.replay import traces
from proxy.replay.records import StepRecord
from proxy.replay.report import percentile
from proxy.replay.runner import Options, Replayer, discover_model, make_client

ROOT = Path(__file__).resolve().parents[2]
TRACES = traces.bundled("dev")
COLD_TOKENS = 1024  # computed tokens beyond what a step's tool results usually take


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--traces", type=Path, default=TRACES, help=f"JSONL traces (default {TRACES})")
    add("--limit", type=int, help="first N conversations (default: all)")
    add("--speed", type=float, default=1.0, help="simulator speed-up (default 1)")
    add("--capacity-tokens", type=int, default=40_000, help="sim KV cache (default 40000)")
    add("--concurrency", type=int, default=24, help="conversations in flight (default 24)")
    add("--tool-latency", type=float, default=5.0, help="seconds per tool round (default 5)")
    add(
        "--tool-latency-max",
        type=float,
        help="vary each tool round between --tool-latency and this (the same in both modes)",
    )
    add("--steps", type=int, help="at most N model calls per conversation (default: all)")
    add(
        "--start-spread",
        type=float,
        default=0.0,
        help="start the first conversations spread over this many seconds (default 0)",
    )
    add("--modes", default="off,on", help="warm-up modes to run, in order (default off,on)")
    add(
        "--proxy-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a proxy setting for both modes, e.g. warmup_max_waiting=4 (repeatable)",
    )
    add("--json", type=Path, help="write each mode's after-tool-call steps here")
    return parser.parse_args(argv)


@contextlib.contextmanager
def engine_and_proxy(args: argparse.Namespace, warmup: bool) -> Iterator[tuple[str, str]]:
    with contextlib.ExitStack() as stack:
        port = free_port()
        engine = f"http://127.0.0.1:{port}"
        sim = ["proxy", "sim", "--port", str(port), "--speed", str(args.speed)]
        sim += ["--capacity-tokens", str(args.capacity_tokens), "--log-level", "warning"]
        stack.enter_context(spawn(sim, engine + "/health"))
        port = free_port()
        proxy = f"http://127.0.0.1:{port}"
        serve = ["proxy", "serve", "--upstream", engine, "--port", str(port)]
        serve += ["--warmup", str(warmup).lower(), "--log-level", "warning"]
        for setting in args.proxy_setting:
            name, _, value = setting.partition("=")
            serve += ["--" + name.replace("_", "-"), value]
        stack.enter_context(spawn(serve, proxy + "/ready"))
        yield engine, proxy


def scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        return str(response.read().decode())


def metric(text: str, name: str, label: str = "") -> float:
    """Sum of the samples of ``name`` whose labels contain ``label``."""
    pattern = re.compile(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", re.MULTILINE)
    return sum(float(m.group(2)) for m in pattern.finditer(text) if label in (m.group(1) or ""))


async def replay(
    args: argparse.Namespace, proxy: str, conversations: list[traces.Conversation]
) -> tuple[list[StepRecord], float]:
    async with make_client(args.concurrency, 600.0) as client:
        model = await discover_model(client, proxy)
        options = Options(
            model=model,
            concurrency=args.concurrency,
            tool_latency=args.tool_latency,
            tool_latency_max=args.tool_latency_max,
            start_spread=args.start_spread,
        )
        run = await Replayer(client, proxy, options).run(conversations)
    return run.steps, run.wall_s


def run_mode(
    args: argparse.Namespace, warmup: bool, conversations: list[traces.Conversation]
) -> dict[str, Any]:
    after_tool = {
        (step.conversation.id, step.index)
        for conversation in conversations
        for step in traces.steps(conversation)
        if step.after_tool
    }
    with engine_and_proxy(args, warmup) as (engine, proxy), QueueSampler(proxy) as queue:
        steps, wall = asyncio.run(replay(args, proxy, conversations))
        engine_text, proxy_text = scrape(engine), scrape(proxy)
    followers = [s for s in steps if (s.conversation, s.step) in after_tool]
    computed = metric(engine_text, "vllm:prompt_tokens_by_source_total", 'source="local_compute"')
    result = summary(warmup, steps, followers, computed, proxy_text, wall)
    # The simulator says how long it ran steps (vLLM does not: None).
    busy = metric(engine_text, "sim:engine_busy_seconds_total")
    known = "sim:engine_busy_seconds_total" in engine_text and wall > 0
    result["engine_idle"] = max(1.0 - busy / wall, 0.0) if known else None
    compute = metric(engine_text, "sim:engine_compute_seconds_total")
    result["engine_compute"] = compute / wall if known else None
    result["queued_share"] = queue.readings
    return result


class QueueSampler:
    """The proxy's reading of its engine's queue (``prefill_proxy_engine_queued_share``,
    the share of the last 30 s of /metrics readings that queued more than
    warmup_max_waiting) every SAMPLE_S while a mode runs: what the saturation rule saw.
    Only a proxy with warm-up on reads it; an Event, not a sleep, paces the thread."""

    SAMPLE_S = 2.0

    def __init__(self, proxy: str) -> None:
        self.proxy = proxy
        self.readings: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> QueueSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        name = "prefill_proxy_engine_queued_share"
        while not self._stop.wait(self.SAMPLE_S):
            with contextlib.suppress(OSError):
                text = scrape(self.proxy)
                if name in text:
                    self.readings.append(metric(text, name))


def truncate(conversation: traces.Conversation, steps: int | None) -> traces.Conversation:
    """The conversation up to its ``steps``-th model call (all of it without a limit). That
    call answers in text, as a finished session does: a cut after tool calls would leave
    warm-ups for a step that never comes, a cost no agent that carries on pays."""
    calls = traces.steps(conversation)
    if steps is None or len(calls) <= steps:
        return conversation
    end = calls[steps - 1].position
    answer = {"role": "assistant", "content": "That is all done. Anything else I can help with?"}
    return dataclasses.replace(conversation, messages=[*conversation.messages[:end], answer])


def summary(
    warmup: bool,
    steps: Sequence[StepRecord],
    followers: Sequence[StepRecord],
    engine_computed: float,
    proxy_text: str,
    wall: float,
    cold_tokens: int = COLD_TOKENS,
) -> dict[str, Any]:
    """One mode's figures: ``followers`` are the steps that answer tool results, the engine
    and proxy figures come from their /metrics."""
    followers = [s for s in followers if s.error is None and s.ttft_s is not None]
    ttfts = [s.ttft_s for s in followers if s.ttft_s is not None]
    prompt = sum(s.prompt_tokens or 0 for s in followers)
    cached = sum(s.cached_tokens or 0 for s in followers)
    # A step that computed more than its new messages could hold lost its prefix.
    cold = [s for s in followers if (s.prompt_tokens or 0) - (s.cached_tokens or 0) > cold_tokens]
    errors = sum(1 for s in steps if s.error is not None)
    skipped = r'^prefill_proxy_warmups_skipped_total\{reason="([^"]+)"\} (\S+)$'
    return {
        "records": [dataclasses.asdict(s) for s in followers],
        "mode": "on" if warmup else "off",
        "steps": len(steps),
        "errors": errors,
        "after_tool": len(followers),
        "cold": len(cold),
        "p50": percentile(ttfts, 0.5),
        "p90": percentile(ttfts, 0.9),
        "p95": percentile(ttfts, 0.95),
        "cached_share": cached / prompt if prompt else 0.0,
        "engine_computed": engine_computed,
        "warmups": metric(proxy_text, "prefill_proxy_warmups_total", 'outcome="ok"'),
        "warmup_errors": metric(proxy_text, "prefill_proxy_warmups_total", 'outcome="error"'),
        "skips": {
            m.group(1): float(m.group(2))
            for m in re.finditer(skipped, proxy_text, re.MULTILINE)
            if float(m.group(2))
        },
        "timed": metric(proxy_text, "prefill_proxy_warmups_total", 'trigger="tool_calls_timed"'),
        "warmup_tokens": metric(proxy_text, "prefill_proxy_warmup_computed_tokens_total"),
        "warmed_cached": metric(proxy_text, "prefill_proxy_warmed_steps_total", '"cached"'),
        "warmed_missed": metric(proxy_text, "prefill_proxy_warmed_steps_total", '"missed"'),
        "wall": wall,
        "engine_idle": None,  # known on the simulator only (run_mode)
        "engine_compute": None,
    }


HEADER = (
    "warm-up",
    "steps (errors)",
    "after tool calls",
    "of which prefix lost",
    "TTFT p50 ms",
    "TTFT p95 ms",
    "cached share",
    "engine computed tokens",
    "warm-ups ok (timed; failed)",
    "skipped",
    "warm-up computed tokens",
    "warmed steps cached / missed",
    "engine idle",
    "wall s",
)


def table(results: list[dict[str, Any]]) -> str:
    """A markdown table, one row per mode, then the comparison. TTFT and cached share are
    those of the steps that follow tool calls; engine tokens count every request."""
    rows = ["| " + " | ".join(HEADER) + " |", "|---" + "|---:" * (len(HEADER) - 1) + "|"]
    for r in results:
        skips = ", ".join(f"{k} {v:.0f}" for k, v in sorted(r["skips"].items())) or "0"
        cells = (
            r["mode"],
            f"{r['steps']} ({r['errors']})",
            str(r["after_tool"]),
            str(r["cold"]),
            f"{1000 * (r['p50'] or 0):.0f}",
            f"{1000 * (r['p95'] or 0):.0f}",
            f"{100 * r['cached_share']:.1f}%",
            f"{r['engine_computed']:,.0f}",
            f"{r['warmups']:.0f} ({r['timed']:.0f}; {r['warmup_errors']:.0f})",
            skips,
            f"{r['warmup_tokens']:,.0f}",
            f"{r['warmed_cached']:.0f} / {r['warmed_missed']:.0f}",
            "n/a" if r["engine_idle"] is None else f"{100 * r['engine_idle']:.0f}%",
            f"{r['wall']:.0f}",
        )
        rows.append("| " + " | ".join(cells) + " |")
    by_mode = {r["mode"]: r for r in results}
    if {"on", "off"} <= by_mode.keys() and by_mode["on"]["p50"]:
        on, off = by_mode["on"], by_mode["off"]
        extra = on["engine_computed"] - off["engine_computed"]
        rows.append(
            f"\nTTFT p50 after tool calls: {1000 * off['p50']:.0f} ms without warm-up, "
            f"{1000 * on['p50']:.0f} ms with it: {off['p50'] / on['p50']:.2f}x lower. Engine "
            f"prefill: {extra:+,.0f} tokens ({100 * extra / max(off['engine_computed'], 1):+.1f}%)"
            f" with warm-ups, which computed {on['warmup_tokens']:,.0f} themselves."
        )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    conversations = [truncate(c, args.steps) for c in traces.load(args.traces, args.limit)]
    print(
        f"{len(conversations)} conversations, concurrency {args.concurrency}, tool latency "
        f"{args.tool_latency} s, sim speed {args.speed}, KV capacity {args.capacity_tokens:,} "
        "tokens\n",
        flush=True,
    )
    results = []
    for mode in args.modes.split(","):
        results.append(run_mode(args, mode == "on", conversations))
        done = results[-1]
        print(f"{mode}: done in {done['wall']:.0f} s", file=sys.stderr, flush=True)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
