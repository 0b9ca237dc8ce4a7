"""Proxy overhead: the latency prefill-proxy adds over calling a fast upstream directly.

Starts the fake upstream (tests/support/fake_upstream.py) and the proxy (the real CLI),
each in its own process on loopback, and drives both from this process with an aiohttp
client: non-stream and stream chat completions at each concurrency, direct and through
the proxy in alternating rounds so machine noise hits both alike. Prints a markdown table;
``--json`` writes the figures. A measurement, not a test: nothing here asserts on timing.

Run from the repository root: ``python -m tests.benchmarks.overhead --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import json
import math
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from proxy.background import free_port, spawn, wait_ready

ROOT = Path(__file__).resolve().parents[2]
CHAT = "/v1/chat/completions"
OVERHEAD_HEADER = "x-prefill-proxy-overhead-ms"  # the proxy's own time before upstream


@dataclasses.dataclass
class Batch:
    """One run of requests against one target. Times in seconds."""

    latency: list[float] = dataclasses.field(default_factory=list)
    ttft: list[float] = dataclasses.field(default_factory=list)
    own_overhead_ms: list[float] = dataclasses.field(default_factory=list)
    elapsed: float = 0.0
    cpu_s: float | None = None  # CPU time of the target's process during the batch


@dataclasses.dataclass
class Target:
    name: str
    url: str
    pid: int | None  # the process to charge CPU time to, when it runs here
    batches: list[Batch] = dataclasses.field(default_factory=list)
    # Each closed-loop worker its own conversation (X-Session-Id), instead of every
    # request one and the same session.
    session_per_worker: bool = False


def request_body(stream: bool) -> bytes:
    messages = [{"role": "user", "content": "Say hello."}]
    return json.dumps({"model": "fake", "messages": messages, "stream": stream}).encode()


def _carries_content(buffer: bytes) -> bool:
    """Whether a whole SSE event in ``buffer`` has a non-empty ``delta.content``."""
    for event in buffer.split(b"\n\n")[:-1]:
        if event.startswith(b"data: {"):
            choices = json.loads(event[6:]).get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                return True
    return False


async def _one(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    stream: bool,
    batch: Batch,
    headers: dict[str, str],
) -> None:
    started = time.perf_counter()
    async with session.post(url, data=body, headers=headers) as r:
        if r.status != 200:
            raise RuntimeError(f"{url} answered {r.status}: {(await r.read())[:200]!r}")
        if own := r.headers.get(OVERHEAD_HEADER):
            batch.own_overhead_ms.append(float(own))
        if not stream:
            await r.read()
        else:
            seen, first = b"", True
            async for data in r.content.iter_any():
                if first and _carries_content(seen := seen + data):
                    batch.ttft.append(time.perf_counter() - started)
                    first = False
    batch.latency.append(time.perf_counter() - started)


def _cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU time of a process (Linux /proc), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_batch(
    session: aiohttp.ClientSession, target: Target, stream: bool, concurrency: int, count: int
) -> Batch:
    """``count`` requests from ``concurrency`` closed-loop workers."""
    url, body, batch = target.url + CHAT, request_body(stream), Batch()
    remaining = count

    async def worker(index: int) -> None:
        nonlocal remaining
        headers = {"content-type": "application/json"}
        if target.session_per_worker:
            headers["x-session-id"] = f"bench-{index}"
        while remaining > 0:
            remaining -= 1
            await _one(session, url, body, stream, batch, headers)

    cpu_before, started = _cpu_seconds(target.pid), time.perf_counter()
    await asyncio.gather(*(worker(index) for index in range(concurrency)))
    batch.elapsed = time.perf_counter() - started
    if cpu_before is not None and (cpu_after := _cpu_seconds(target.pid)) is not None:
        batch.cpu_s = cpu_after - cpu_before
    return batch


async def measure_cell(
    targets: list[Target], stream: bool, concurrency: int, requests: int, rounds: int
) -> None:
    """Warm up a fresh keep-alive pool per target, then alternate rounds between targets
    (reversing the order every other round)."""
    pairs = [
        (t, aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)))
        for t in targets
    ]
    try:
        for target, session in pairs:
            target.batches = []
            await run_batch(session, target, stream, concurrency, max(4 * concurrency, 100))
        for index in range(rounds):
            for target, session in pairs if index % 2 == 0 else reversed(pairs):
                batch = await run_batch(session, target, stream, concurrency, requests // rounds)
                target.batches.append(batch)
    finally:
        for _, session in pairs:
            await session.close()


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile, ``q`` in 0..100."""
    ordered = sorted(values)
    rank = min(max(math.ceil(len(ordered) * q / 100), 1), len(ordered))
    return ordered[rank - 1]


def summarize(target: Target, metric: str) -> dict[str, Any]:
    """p50/p99 in ms of ``metric`` (latency or ttft) over all rounds, and per round."""
    values = [v for b in target.batches for v in getattr(b, metric)]
    count = sum(len(b.latency) for b in target.batches)
    cpus = [b.cpu_s for b in target.batches if b.cpu_s is not None]
    result: dict[str, Any] = {
        "p50_ms": percentile(values, 50) * 1000,
        "p99_ms": percentile(values, 99) * 1000,
        "round_p50_ms": [percentile(getattr(b, metric), 50) * 1000 for b in target.batches],
        "requests": count,
        "req_per_s": count / sum(b.elapsed for b in target.batches),
    }
    if len(cpus) == len(target.batches):
        result["cpu_ms_per_request"] = sum(cpus) / count * 1000
    if own := [v for b in target.batches for v in b.own_overhead_ms]:
        result["own_overhead_header_p50_ms"] = percentile(own, 50)
    return result


def cell_rows(stream: bool, concurrency: int, direct: Target, proxy: Target) -> list[dict]:
    rows = []
    for metric in ("ttft", "latency") if stream else ("latency",):
        d, p = summarize(direct, metric), summarize(proxy, metric)
        by_round = [b - a for a, b in zip(d["round_p50_ms"], p["round_p50_ms"], strict=True)]
        rows.append(
            {
                "mode": "stream" if stream else "non-stream",
                "concurrency": concurrency,
                "metric": "TTFT"
                if metric == "ttft"
                else "full stream"
                if stream
                else "full response",
                "direct": d,
                "proxy": p,
                "added_p50_ms": p["p50_ms"] - d["p50_ms"],
                "added_p99_ms": p["p99_ms"] - d["p99_ms"],
                "added_p50_by_round_ms": by_round,
            }
        )
    return rows


def markdown(rows: list[dict]) -> str:
    columns = "mode|c|metric|direct p50|direct p99|proxy p50|proxy p99|**added p50**|added p99"
    columns += "|added p50 per round|req/s direct / proxy|proxy CPU/req"
    lines = ["| " + columns.replace("|", " | ") + " |", "|---" * (columns.count("|") + 1) + "|"]
    for r in rows:
        d, p, rounds = r["direct"], r["proxy"], r["added_p50_by_round_ms"]
        cpu = p.get("cpu_ms_per_request")
        cells = [r["mode"], r["concurrency"], r["metric"], f"{d['p50_ms']:.2f}"]
        cells += [f"{d['p99_ms']:.2f}", f"{p['p50_ms']:.2f}", f"{p['p99_ms']:.2f}"]
        cells += [f"**{r['added_p50_ms']:+.2f}**", f"{r['added_p99_ms']:+.2f}"]
        cells += [f"{min(rounds):+.2f} .. {max(rounds):+.2f}"]
        cells += [f"{d['req_per_s']:,.0f} / {p['req_per_s']:,.0f}"]
        cells += ["-" if cpu is None else f"{cpu:.2f} ms"]
        lines.append("| " + " | ".join(str(cell) for cell in cells) + " |")
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cores": cores,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "client": f"aiohttp {aiohttp.__version__} on uvloop {uvloop.__version__}",
    }


def serve_upstream(port: int) -> None:
    """The fast upstream, on uvloop like the proxy, until interrupted or terminated."""
    from tests.support.fake_upstream import FakeUpstream

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())  # before FakeUpstream makes a loop
    with FakeUpstream(port=port, record=False) as upstream, contextlib.suppress(KeyboardInterrupt):
        print(upstream.url, flush=True)
        signal.pause()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--requests", type=int, default=8000, help="measured requests per cell and target")
    add("--rounds", type=int, default=8, help="alternating direct/proxy rounds per cell")
    add("--concurrency", default="1,64", help="comma-separated concurrencies (default 1,64)")
    add("--modes", default="non-stream,stream", help="comma-separated: non-stream, stream")
    add("--json", metavar="OUT", type=Path, help="also write the figures to this file")
    add("--upstream-url", help="use this running upstream instead of starting one")
    add(
        "--proxy-url",
        help="measure this running proxy instead of starting one "
        "(needs --upstream-url: the upstream that proxy forwards to)",
    )
    add("--serve-upstream", type=int, metavar="PORT", help="only run the fast upstream on PORT")
    args = parser.parse_args()
    if args.proxy_url and not args.upstream_url:
        parser.error("--proxy-url needs --upstream-url, the upstream that proxy forwards to")
    return args


async def measure(args: argparse.Namespace, direct: Target, proxy: Target) -> list[dict]:
    rows = []
    for mode in args.modes.split(","):
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            stream = mode.strip() == "stream"
            await measure_cell([direct, proxy], stream, concurrency, args.requests, args.rounds)
            rows += cell_rows(stream, concurrency, direct, proxy)
            print(f"measured {mode} c={concurrency}", file=sys.stderr, flush=True)
    return rows


def report(args: argparse.Namespace, env: dict[str, Any], rows: list[dict]) -> None:
    print(f"\n#### Proxy overhead, {env['date']}: {env['cores']} cores, Python {env['python']}\n")
    print(
        f"{env['platform']}; loopback; fake upstream on uvloop; client {env['client']}; "
        f"{args.requests} requests per cell and target in {args.rounds} alternating rounds. "
        "Client, proxy and upstream share the cores: at c=64 the CPU is saturated, so added "
        "latency there is mostly queueing (about c x the proxy's CPU per request). Times in ms.\n"
    )
    print(markdown(rows), flush=True)
    if args.json:
        options = {k: str(v) for k, v in vars(args).items()}
        figures = {"environment": env, "options": options, "rows": rows}
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


def main() -> int:
    args = parse_args()
    if args.serve_upstream is not None:
        serve_upstream(args.serve_upstream)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the with blocks clean up
    env = environment()
    with contextlib.ExitStack() as stack:
        upstream_url, proxy_url, proxy_pid = args.upstream_url, args.proxy_url, None
        if upstream_url is None:
            port = free_port()
            upstream_url = f"http://127.0.0.1:{port}"
            command = ["tests.benchmarks.overhead", "--serve-upstream", str(port)]
            stack.enter_context(spawn(command, upstream_url + "/health", cwd=str(ROOT)))
        if proxy_url is None:
            port = free_port()
            proxy_url = f"http://127.0.0.1:{port}"
            command = [
                "proxy",
                "serve",
                "--upstream",
                upstream_url,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ]
            process = spawn(command, proxy_url + "/ready", cwd=str(ROOT))
            proxy_pid = stack.enter_context(process).pid
        else:
            wait_ready(proxy_url.rstrip("/") + "/health", None)
        direct = Target("direct", upstream_url.rstrip("/"), None)
        proxy = Target("proxy", proxy_url.rstrip("/"), proxy_pid)
        rows = uvloop.run(measure(args, direct, proxy))
    report(args, env, rows)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
