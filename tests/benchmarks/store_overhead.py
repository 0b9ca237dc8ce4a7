"""The session store's cost per request: the proxy with in-memory sessions and with the
Redis store (a local valkey-server), against the same fast upstream, in the same run.

Starts the fake upstream, a valkey-server and two proxies (the real CLI, one per store),
and drives all three targets in alternating rounds with tests/benchmarks/overhead.py's
client: non-stream and stream chat completions at each concurrency, each closed-loop
worker its own conversation (X-Session-Id), so every request loads and saves its own
record. Prints the overhead table for each store and the Redis store's added p50 over
memory. A measurement, not a test.

Run from the repository root: ``python -m tests.benchmarks.store_overhead --help``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import uvloop

from proxy.background import free_port, spawn
from tests.benchmarks import overhead
from tests.support.valkey import Valkey


def proxy_command(port: int, upstream: str, *extra: str) -> list[str]:
    return [
        "proxy", "serve", "--upstream", upstream, "--host", "127.0.0.1",
        "--port", str(port), "--log-level", "warning", *extra,
    ]  # fmt: skip


async def measure(args: argparse.Namespace, targets: list[overhead.Target]) -> list[str]:
    direct, memory, redis = targets
    lines = []
    for mode in args.modes.split(","):
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            stream = mode.strip() == "stream"
            await overhead.measure_cell(targets, stream, concurrency, args.requests, args.rounds)
            for name, target in (("memory", memory), ("redis", redis)):
                rows = overhead.cell_rows(stream, concurrency, direct, target)
                lines.append(f"**{name}**, {mode} c={concurrency}\n\n{overhead.markdown(rows)}\n")
            for metric in ("ttft", "latency") if stream else ("latency",):
                m, r = overhead.summarize(memory, metric), overhead.summarize(redis, metric)
                p50, p99 = r["p50_ms"] - m["p50_ms"], r["p99_ms"] - m["p99_ms"]
                cpu = r.get("cpu_ms_per_request", 0) - m.get("cpu_ms_per_request", 0)
                lines.append(
                    f"redis - memory, {mode} c={concurrency} {metric}: p50 {p50:+.2f} ms, "
                    f"p99 {p99:+.2f} ms, CPU/req {cpu:+.3f} ms, "
                    f"req/s {m['req_per_s']:,.0f} -> {r['req_per_s']:,.0f}\n"
                )
            print(f"measured {mode} c={concurrency}", file=sys.stderr, flush=True)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=4000, help="per cell and target")
    parser.add_argument("--rounds", type=int, default=8, help="alternating rounds per cell")
    parser.add_argument("--concurrency", default="1,64", help="comma-separated (default 1,64)")
    parser.add_argument("--modes", default="non-stream,stream", help="non-stream, stream")
    args = parser.parse_args()
    store = Valkey()
    store.start()
    with contextlib.ExitStack() as stack:
        stack.callback(store.stop)
        port = free_port()
        upstream = f"http://127.0.0.1:{port}"
        command = ["tests.benchmarks.overhead", "--serve-upstream", str(port)]
        stack.enter_context(spawn(command, upstream + "/health"))
        targets = [overhead.Target("direct", upstream, None, session_per_worker=True)]
        for name, extra in (
            ("memory", ()),
            ("redis", ("--session-store", "redis", "--redis-url", store.url)),
        ):
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            process = stack.enter_context(
                spawn(proxy_command(port, upstream, *extra), url + "/ready")
            )
            targets.append(overhead.Target(name, url, process.pid, session_per_worker=True))
        lines = uvloop.run(measure(args, targets))
    env = overhead.environment()
    print(
        f"\n#### Session store overhead, {env['date']}: {env['cores']} cores, {env['platform']}\n"
    )
    print(
        f"valkey-server on loopback; {args.requests} requests per cell and target in "
        f"{args.rounds} alternating rounds (direct, memory, redis); each worker its own "
        "session. Times in ms.\n"
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
