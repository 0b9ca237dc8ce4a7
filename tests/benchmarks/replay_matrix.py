"""Every client profile, direct vs through the proxy, on one engine: the replay matrix.

Starts the proxy (and, without --engine, the simulator) as child processes, replays the
traces once per profile with ``--compare`` (the engine's prefix cache reset before each
run), writes each profile's JSON and prints one markdown table for an issue note.

    .venv/bin/python -m tests.benchmarks.replay_matrix                       # simulator
    .venv/bin/python -m tests.benchmarks.replay_matrix --engine http://127.0.0.1:8000 \\
        --shortest 3 --max-tokens 16                                          # real vLLM
    (--median 3 instead of --shortest 3: three conversations of median length, 11-17 steps)
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
from pathlib import Path
from typing import Any

from proxy.demo import simulator_and_proxy
from proxy.replay import benchmark, traces
from proxy.replay.profiles import PROFILES

ROOT = Path(__file__).resolve().parents[2]
TRACES = traces.bundled("dev")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--traces", type=Path, default=TRACES, help=f"JSONL traces (default {TRACES})")
    add("--engine", help="a running engine (vLLM with VLLM_SERVER_DEV_MODE=1); default: sim")
    add("--speed", type=float, default=50.0, help="simulator speed-up (default 50)")
    add("--limit", type=int, help="first N conversations")
    add("--shortest", type=int, metavar="N", help="only the N shortest conversations")
    add("--median", type=int, metavar="N", help="only the N conversations of median length")
    add("--concurrency", type=int, default=1, help="conversations in flight (default 1)")
    add("--max-tokens", type=int, help="max_tokens per step (real vLLM on a CPU: 16)")
    add("--profiles", default=",".join(PROFILES), help="comma-separated (default: all)")
    add("--api", choices=("chat", "responses"), default="chat", help="the clients' wire format")
    add("--echo-replies", action="store_true", help="send back the engine's replies (chat)")
    add("--out", type=Path, default=Path(".artifacts/replay-matrix"), help="JSON folder")
    return parser.parse_args()


def subset(traces: Path, count: int, folder: Path, *, median: bool = False) -> Path:
    """A JSONL of the ``count`` conversations with the fewest characters (a real engine on a
    CPU replays those in minutes), or of the ``count`` around the median length, in their
    original order."""
    lines = traces.read_text().splitlines()
    by_length = sorted(range(len(lines)), key=lambda i: len(lines[i]))
    start = max(len(lines) // 2 - count // 2, 0) if median else 0
    keep = sorted(by_length[start : start + count])
    path = folder / f"{'median' if median else 'shortest'}-{count}.jsonl"
    path.write_text("".join(lines[i] + "\n" for i in keep))
    return path


def row(profile: str, direct: dict[str, Any], proxied: dict[str, Any]) -> str:
    def share(summary: dict[str, Any], key: str = "cached_share_after_first_step") -> str:
        return f"{100 * (summary.get(key) or 0):.1f}%"

    settled = "cached_share_from_step_2"

    def ms(summary: dict[str, Any]) -> str:
        return f"{1000 * (summary['ttft_p50_s'] or 0):.1f}"

    return (
        f"| {profile} | {direct['requests']} | {share(direct)} | {share(proxied)} | "
        f"{share(direct, settled)} | {share(proxied, settled)} | "
        f"{direct['computed_tokens']:,} | {proxied['computed_tokens']:,} | "
        f"{ms(direct)} | {ms(proxied)} | {direct['errors'] + proxied['errors']} |"
    )


def main() -> int:
    args = parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.shortest or args.median:
        count = args.shortest or args.median
        args.traces = subset(args.traces, count, args.out, median=bool(args.median))
    print(
        "| profile | requests | cached share, steps >= 1 (direct) | (proxy) | steps >= 2 "
        "(direct) | (proxy) | computed tokens (direct) | (proxy) | TTFT p50 ms (direct) | "
        "(proxy) | errors |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        flush=True,
    )
    for profile in args.profiles.split(","):
        # A fresh proxy (and simulator) per profile: sessions left by another profile's
        # run of the same conversations would make this run a retry of those.
        with simulator_and_proxy(args.speed, args.engine) as (engine, proxy):
            path = args.out / f"{profile}-{args.api}.json"
            config = benchmark.Config(
                target=engine,
                compare=proxy,
                reset_cache=engine,
                traces=args.traces,
                limit=args.limit,
                profile=profile,
                concurrency=args.concurrency,
                max_tokens=args.max_tokens,
                json_path=path,
                api=args.api,
                echo_replies=args.echo_replies,
            )
            status = asyncio.run(benchmark.execute(config, io.StringIO(), sys.stderr))
            if status == 2:
                return 2
            runs = json.loads(path.read_text())
            print(row(profile, runs["direct"]["summary"], runs["proxy"]["summary"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
