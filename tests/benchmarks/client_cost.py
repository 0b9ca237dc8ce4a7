"""What the engine client costs: CPU per request of proxy.upstream (its send, read and
close, on the pool of proxy.http1) against the least an HTTP/1.1 client on asyncio can do
(one kept-alive connection, the request written in one call, the response parsed by
httptools). Both send the same body to the overhead benchmark's fast upstream, one
request at a time, and are charged their own process's CPU time. What is left to save
(tests/benchmarks/README.md); the minimal one is no client to use: no pool, timeouts,
chunked bodies or errors.

Run from the repository root: ``python -m tests.benchmarks.client_cost``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time

import httptools
import uvloop

from proxy.background import free_port, spawn
from proxy.upstream import Upstream
from tests.benchmarks import overhead


class _Minimal(asyncio.Protocol):
    """One connection: each response's body handed to the waiting request at its end."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[bytes] | None = None
        self.body: list[bytes] = []

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        waiter, self.waiter, body, self.body = self.waiter, None, self.body, []
        assert waiter is not None
        waiter.set_result(b"".join(body))


async def minimal(url: str, body: bytes, count: int) -> float:
    """CPU seconds per request of the minimal client."""
    host, port = url.removeprefix("http://").split(":")
    loop = asyncio.get_running_loop()
    transport, connection = await loop.create_connection(_Minimal, host, int(port))
    head = b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n" % (
        overhead.CHAT.encode(),
        host.encode(),
    )
    head += b"content-length: %d\r\n\r\n" % len(body)
    started = time.process_time()
    for _ in range(count):
        connection.waiter = loop.create_future()
        transport.writelines([head, body])
        await connection.waiter
    spent = time.process_time() - started
    transport.close()
    return spent / count


async def with_upstream(url: str, body: bytes, count: int) -> float:
    """CPU seconds per request of proxy.upstream."""
    from proxy import config

    upstream = Upstream(config.load({"upstream": url}, environ={}))
    headers = [(b"content-type", b"application/json")]
    started = time.process_time()
    for _ in range(count):
        response = await upstream.send("POST", overhead.CHAT, headers, body)
        await response.read()
        await response.aclose()
    spent = time.process_time() - started
    await upstream.aclose()
    return spent / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="per client and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="2msg,64k", help="as overhead.py's --sizes")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        command = ["tests.benchmarks.overhead", "--serve-upstream", str(port)]
        stack.enter_context(spawn(command, url + "/health", cwd=str(overhead.ROOT)))
        print("| request | proxy.upstream | minimal | difference |\n|---|---:|---:|---:|")
        for size in args.sizes.split(","):
            if overhead.SIZES[size]:
                body = overhead.AgentSessions(overhead.SIZES[size], False).body(0, 1)
            else:
                body = overhead.request_body(False)
            for _ in range(args.rounds):  # alternating, as overhead.py does
                ours = uvloop.run(with_upstream(url, body, args.requests))
                least = uvloop.run(minimal(url, body, args.requests))
                print(
                    f"| {size} | {ours * 1e3:.3f} ms | {least * 1e3:.3f} ms "
                    f"| {(ours - least) * 1e3:.3f} ms |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
