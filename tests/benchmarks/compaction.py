"""Compaction at one context budget: a client that trims its own history (client-trim)
straight to the engine vs a faithful client through the proxy, which compacts.

The dev traces plus a few long synthetic sessions (100+ model calls) are replayed twice,
each run on a fresh engine whose context is the budget: (a) profile ``client-trim``
straight to the engine, trimmed to fit under the same high watermark; (b) profile
``faithful`` through the proxy with ``--context-limit`` at the budget. Per part (dev
traces, long sessions, all) it prints: the largest forwarded prompt against the high
watermark, compaction events by kind (the proxy's ``x-prefill-proxy-compaction`` response
header), the cached share of the steps between compaction events, the prefill tokens the
engine computed (from the client's usage, and in all from the engine's own counters, which
also count the proxy's summary and warm-up requests) and TTFT at compaction steps vs the
others; then the proxy's compaction metrics.

    .venv/bin/python -m tests.benchmarks.compaction                        # simulator
    .venv/bin/python -m tests.benchmarks.compaction --engine http://127.0.0.1:8000 \\
        --shortest 3 --long 0 --max-tokens 16                               # real vLLM
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import io
import json
import sys
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from proxy import tokens
from proxy.background import free_port, spawn
from proxy.replay import benchmark, synthetic
from proxy.replay.report import percentile
from tests.benchmarks.replay_matrix import TRACES, subset

HIGH = 0.75  # the proxy's default compaction_high
LONG_SEED = 100  # long sessions: another seed than the demo's, so no prefix is shared


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--traces", type=Path, default=TRACES, help=f"JSONL traces (default {TRACES})")
    add("--context-limit", type=int, default=12_288, help="the budget (default 12288)")
    add("--long", type=int, default=4, help="long synthetic sessions (default 4)")
    add("--long-steps", type=int, default=120, help="model calls per long session (120)")
    add("--trim-tokens", type=int, help="client-trim's budget (default: fit under high)")
    add("--engine", help="a running engine (vLLM with VLLM_SERVER_DEV_MODE=1); default: sim")
    add("--speed", type=float, default=50.0, help="simulator speed-up (default 50)")
    add("--shortest", type=int, metavar="N", help="only the N shortest trace conversations")
    add("--limit", type=int, help="first N trace conversations")
    add("--concurrency", type=int, default=1, help="conversations in flight (default 1)")
    add("--max-tokens", type=int, help="max_tokens per step (real vLLM on a CPU: 16)")
    add(
        "--tool-latency",
        type=float,
        default=0.0,
        help="seconds the client spends on its tools before a step (default 0)",
    )
    add("--proxy-arg", action="append", default=[], help="extra `proxy serve` argument")
    add("--out", type=Path, default=Path(".artifacts/compaction"), help="JSON folder")
    return parser.parse_args()


def conversation_set(args: argparse.Namespace) -> Path:
    """The dev traces (or some of them) and the long sessions, in one JSONL file."""
    traces = subset(args.traces, args.shortest, args.out) if args.shortest else args.traces
    lines = traces.read_text().splitlines()[: args.limit]
    long = synthetic.generate(args.long, LONG_SEED, steps=args.long_steps)
    path = args.out / "conversations.jsonl"
    path.write_text("".join(line + "\n" for line in lines + [json.dumps(r) for r in long]))
    return path


def trim_budget(path: Path, limit: int) -> int:
    """client-trim's budget: the high watermark, less the largest tool list (trim_messages
    does not count tools) and 5% of the limit for the chat template's framing."""
    tokens.provision()
    count = tokens.counter().count
    tools = max(count(json.dumps(json.loads(line)["tools"])) for line in path.open())
    return int(limit * HIGH) - tools - limit // 20


def scrape(url: str) -> dict[tuple[str, str], float]:
    """Prometheus samples summed by (name, first label value)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: dict[tuple[str, str], float] = collections.defaultdict(float)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k not in ("model", "model_name")}
            key = (sample.name, next(iter(labels.values()), "") if labels else "")
            samples[key] += sample.value
    return samples


def total(samples: dict[tuple[str, str], float], name: str) -> float:
    return sum(value for (sample, _), value in samples.items() if sample == name)


def by_label(samples: dict[tuple[str, str], float], name: str) -> dict[str, int]:
    return {label: int(v) for (sample, label), v in samples.items() if sample == name and v}


@contextlib.contextmanager
def engine_at(args: argparse.Namespace) -> Iterator[str]:
    if args.engine:
        yield args.engine
        return
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    sim = ["proxy", "sim", "--port", str(port), "--speed", str(args.speed)]
    sim += ["--max-model-len", str(args.context_limit), "--log-level", "warning"]
    with spawn(sim, url + "/health"):
        yield url


@contextlib.contextmanager
def proxy_before(engine: str, args: argparse.Namespace) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = ["proxy", "serve", "--upstream", engine, "--port", str(port)]
    serve += ["--context-limit", str(args.context_limit), "--log-level", "warning"]
    with spawn([*serve, *args.proxy_arg], url + "/ready"):
        yield url


def replay(args: argparse.Namespace, path: Path, label: str, **run: Any) -> dict[str, Any]:
    """One run on a fresh (or reset) engine: the replay's JSON, the engine's computed
    prefill tokens, and the proxy's metrics when it went through one."""
    through_proxy = run["profile"] == "faithful"
    with engine_at(args) as engine:
        proxy = proxy_before(engine, args) if through_proxy else contextlib.nullcontext(None)
        with proxy as proxy_url:
            before = scrape(engine)
            json_path = args.out / f"{label}.json"
            config = benchmark.Config(
                target=proxy_url or engine,
                reset_cache=engine,
                traces=path,
                concurrency=args.concurrency,
                max_tokens=args.max_tokens,
                tool_latency=args.tool_latency,
                json_path=json_path,
                **run,
            )
            status = asyncio.run(benchmark.execute(config, io.StringIO(), sys.stderr))
            if status == 2:
                raise SystemExit(f"{label}: the replay could not run")
            after = scrape(engine)
            proxy_metrics = scrape(proxy_url) if proxy_url else {}

    def delta(name: str) -> float:
        return total(after, name) - total(before, name)

    computed = delta("vllm:prompt_tokens_total") - delta("vllm:prompt_tokens_cached_total")
    return {
        "steps": json.loads(json_path.read_text())["steps"],
        "engine_computed": int(computed),
        "proxy": proxy_metrics,
    }


def figures(steps: list[dict[str, Any]], high: int) -> dict[str, Any]:
    ok = [s for s in steps if s["error"] is None]
    compacted = [s for s in ok if s["compaction"]]
    between = [s for s in ok if s["step"] >= 1 and not s["compaction"]]
    prompt = sum(s["prompt_tokens"] or 0 for s in between)
    cached = sum(s["cached_tokens"] or 0 for s in between)
    prompts = [s["prompt_tokens"] or 0 for s in ok]

    def p50(group: list[dict[str, Any]], key: str, scale: float = 1.0) -> float | None:
        return percentile([s[key] * scale for s in group if s.get(key) is not None], 0.5)

    return {
        "requests": len(steps),
        "errors": len(steps) - len(ok),
        "largest": max(prompts, default=0),
        "over high": sum(p > high for p in prompts),
        "events": Counter(s["compaction"] for s in compacted),
        "conversations compacted": len({s["conversation"] for s in compacted}),
        "cached share": cached / prompt if prompt else None,
        "computed": sum((s["prompt_tokens"] or 0) - (s["cached_tokens"] or 0) for s in ok),
        "ttft compaction": p50(compacted, "ttft_s"),
        "ttft others": p50(between, "ttft_s"),
        "overhead compaction": p50(compacted, "proxy_overhead_ms", 0.001),
        "overhead others": p50(between, "proxy_overhead_ms", 0.001),
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.1f} ms"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _events(events: Counter[str]) -> str:
    return ", ".join(f"{kind} {count}" for kind, count in sorted(events.items())) or "-"


ROWS = (
    ("requests (errors)", lambda f: f"{f['requests']:,} ({f['errors']})"),
    ("largest prompt (steps over high)", lambda f: f"{f['largest']:,} ({f['over high']})"),
    ("compaction events", lambda f: _events(f["events"])),
    ("conversations compacted", lambda f: str(f["conversations compacted"])),
    ("cached share, steps >= 1 between events", lambda f: _pct(f["cached share"])),
    ("prefill computed (client usage)", lambda f: f"{f['computed']:,}"),
    ("TTFT p50, compaction steps", lambda f: _ms(f["ttft compaction"])),
    ("TTFT p50, other steps >= 1", lambda f: _ms(f["ttft others"])),
    ("proxy overhead p50, compaction steps", lambda f: _ms(f["overhead compaction"])),
    ("proxy overhead p50, other steps >= 1", lambda f: _ms(f["overhead others"])),
)


PARTS = {  # label -> which steps
    "dev traces": lambda step: not step["conversation"].startswith("synthetic-"),
    "long sessions": lambda step: step["conversation"].startswith("synthetic-"),
    "all": lambda step: True,
}


def table(runs: dict[str, dict[str, Any]], high: int) -> str:
    """A column per (part, run), then the proxy's prefill as a share of client-trim's."""
    columns, ratios = [], []
    for part, keep in PARTS.items():
        per_run = {
            label: figures([s for s in run["steps"] if keep(s)], high)
            for label, run in runs.items()
        }
        columns += [(f"{label}, {part}", f) for label, f in per_run.items()]
        trimmed, proxied = per_run["client-trim"]["computed"], per_run["proxy"]["computed"]
        ratios += ["", f"{proxied / trimmed:.3f}" if trimmed else "-"]
    lines = ["| metric | " + " | ".join(name for name, _ in columns) + " |"]
    lines.append("|---|" + "---:|" * len(columns))
    for name, show in ROWS:
        lines.append(f"| {name} | " + " | ".join(show(f) for _, f in columns) + " |")
    lines.append("| prefill computed, proxy / client-trim | " + " | ".join(ratios) + " |")
    return "\n".join(lines)


def proxy_lines(runs: dict[str, dict[str, Any]]) -> list[str]:
    trim, proxied = runs["client-trim"], runs["proxy"]
    metrics = proxied["proxy"]
    client = figures(proxied["steps"], 0)["computed"]  # what the replay's usage showed
    lines = [
        f"- engine prefill computed, engine counters: client-trim {trim['engine_computed']:,}, "
        f"proxy {proxied['engine_computed']:,} (of which the proxy's own requests, summaries "
        f"and warm-ups: {proxied['engine_computed'] - client:,}); ratio "
        f"{proxied['engine_computed'] / max(trim['engine_computed'], 1):.3f} (goal <= 0.333)",
    ]
    for name, what in (
        ("prefill_proxy_compactions_total", "compaction events by kind"),
        ("prefill_proxy_summaries_total", "summaries by outcome"),
        ("prefill_proxy_compaction_fallbacks_total", "fallbacks by reason"),
    ):
        lines.append(f"- {what} (proxy metrics): {by_label(metrics, name) or '-'}")
    removed = total(metrics, "prefill_proxy_compaction_removed_tokens_total")
    lines.append(f"- prompt tokens removed by compaction (proxy estimate): {int(removed):,}")
    for name, what in (
        ("prefill_proxy_summary_seconds", "summary written in"),
        ("prefill_proxy_compaction_wait_seconds", "wait for a summary at a compaction"),
    ):
        count = total(metrics, name + "_count")
        if count:
            mean = total(metrics, name + "_sum") / count
            lines.append(f"- {what}: mean {mean * 1000:,.1f} ms over {int(count)}")
    return lines


def _keyed(samples: dict[tuple[str, str], float]) -> dict[str, float]:
    return {f"{name}{{{label}}}" if label else name: v for (name, label), v in samples.items()}


def main() -> int:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = conversation_set(args)
    high = int(args.context_limit * HIGH)
    trim = args.trim_tokens or trim_budget(path, args.context_limit)
    print(
        f"## compaction: context limit {args.context_limit:,}, high watermark {high:,}, "
        f"client-trim budget {trim:,} message tokens; simulator speed "
        f"{'-' if args.engine else args.speed}\n",
        flush=True,
    )
    runs = {
        "client-trim": replay(args, path, "client-trim", profile="client-trim", trim_tokens=trim),
        "proxy": replay(args, path, "proxy", profile="faithful"),
    }
    print(table(runs, high) + "\n")
    print("\n".join(proxy_lines(runs)))
    summary = {
        label: {"engine_computed": run["engine_computed"], "proxy_metrics": _keyed(run["proxy"])}
        for label, run in runs.items()
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
