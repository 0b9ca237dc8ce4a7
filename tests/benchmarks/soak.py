"""Soak: N concurrent streaming clients for S seconds through a `prefill-proxy serve`
process to a fake upstream that paces its tokens; prints errors, the proxy's resident
memory and open file descriptors before, during (every 5 s) and after. Bounded in time and
count; a measurement, not a test.

    .venv/bin/python -m tests.benchmarks.soak --streams 500 --seconds 60
    .venv/bin/python -m tests.benchmarks.soak --long-stream 3000000 --token-delay 0
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path

import aiohttp

from proxy.background import free_port, spawn
from tests.support.fake_upstream import FakeUpstream

BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": "Tell me a story."}],
    "stream": True,
}


def footprint(pid: int) -> tuple[float, int]:
    """(resident MB, open file descriptors) of a process (Linux /proc)."""
    rss_pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    return rss_pages * os.sysconf("SC_PAGE_SIZE") / 1e6, len(os.listdir(f"/proc/{pid}/fd"))


async def client(session: aiohttp.ClientSession, url: str, deadline: float, tally: dict) -> None:
    while time.monotonic() < deadline:
        try:
            async with session.post(url, json=BODY) as response:
                body = await response.read()
            ok = response.status == 200 and body.endswith(b"data: [DONE]\n\n")
            tally["ok" if ok and b'"error"' not in body else "errors"] += 1
        except (TimeoutError, aiohttp.ClientError):
            tally["errors"] += 1


async def soak(url: str, pid: int, streams: int, seconds: float) -> None:
    tally = {"ok": 0, "errors": 0}
    print("| when | streams done | errors | proxy RSS MB | proxy fds |\n|---|---:|---:|---:|---:|")
    rss, fds = footprint(pid)
    print(f"| before | 0 | 0 | {rss:.0f} | {fds} |")
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=streams)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        workers = [
            asyncio.create_task(client(session, url, deadline, tally)) for _ in range(streams)
        ]
        started = time.monotonic()
        while not all(w.done() for w in workers):
            await asyncio.sleep(5)
            rss, fds = footprint(pid)
            print(
                f"| {time.monotonic() - started:.0f} s | {tally['ok']} | {tally['errors']} "
                f"| {rss:.0f} | {fds} |",
                flush=True,
            )
        await asyncio.gather(*workers)
    await asyncio.sleep(2)  # connections close, the proxy settles
    rss, fds = footprint(pid)
    print(f"| after | {tally['ok']} | {tally['errors']} | {rss:.0f} | {fds} |")


async def long_stream(url: str, pid: int, tokens: int) -> None:
    """One stream of ``tokens`` tokens: the proxy's memory must not grow with it."""
    print("| tokens relayed | proxy RSS MB |\n|---:|---:|")
    print(f"| 0 | {footprint(pid)[0]:.0f} |")
    seen, mark = 0, tokens // 5
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        headers = {"x-fault": f"tokens-{tokens}"}
        async with session.post(url, json=BODY, headers=headers) as response:
            async for line in response.content:
                if line.startswith(b"data: {"):
                    seen += 1
                    if seen % mark == 0:
                        print(f"| {seen:,} | {footprint(pid)[0]:.0f} |", flush=True)
    await asyncio.sleep(1)
    print(f"| done ({seen:,} events) | {footprint(pid)[0]:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--token-delay", type=float, default=0.1, help="upstream pacing (s)")
    parser.add_argument(
        "--long-stream", type=int, metavar="TOKENS", help="instead: one stream this long"
    )
    args = parser.parse_args()
    with FakeUpstream(token_delay=args.token_delay, record=False) as upstream:
        port = free_port()
        command = [
            "proxy",
            "serve",
            "--upstream",
            upstream.url,
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
        with spawn(command, f"http://127.0.0.1:{port}/health") as process:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            if args.long_stream:
                asyncio.run(long_stream(url, process.pid, args.long_stream))
            else:
                asyncio.run(soak(url, process.pid, args.streams, args.seconds))


if __name__ == "__main__":
    main()
