"""What forwarding a big body while the proxy still works on it could buy: an emulation,
not a feature. A measurement for issue 16's next step, kept so it can be run again.

The proxy today reads a request, works on it (parse, session, rewrites, compaction,
encode: about 1 ms at 1 MB) and only then writes it to the engine, which then reads it.
This runs the proxy with chat completions of ``--min-bytes`` or more handled another way:
the request head and all but the last ``--tail`` bytes of the client's body go to the
engine first, then the proxy does all of its work as usual, then the last bytes go. What
the work produced is thrown away (the client's bytes are forwarded, so this is only for
the fast fake upstream of ``overhead.py``, which answers whatever it is sent), and the
reply is recorded into the session as usual. Non-streamed requests only; one upstream.

    python -m tests.benchmarks.overhead --serve-upstream 9101 &
    python -m tests.benchmarks.upload_overlap 9102 http://127.0.0.1:9101 &            # as is
    python -m tests.benchmarks.upload_overlap 9103 http://127.0.0.1:9101 --overlap &  # early
    python -m tests.benchmarks.overhead --upstream-url http://127.0.0.1:9101 \\
        --proxy-url http://127.0.0.1:9102 --sizes 1m --modes non-stream --concurrency 1 \\
        --requests 800 --rounds 4        # then --proxy-url ...:9103; alternate, repeat

A real version would send the session's previous forwarded body up to its last message
(the bytes the proxy keeps stable) with chunked transfer encoding, check it against the
body it then builds, and abort and resend where they differ.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time

from proxy import chat, cli, headers, http1, upstream
from proxy.pieces import Pieces

TAIL = 40_000  # about a step's new messages at 1 MB
MIN_BYTES = 256 << 10


def _overlapped(tail: int, min_bytes: int) -> None:
    """ChatCall.handle, with the early write, for bodies of ``min_bytes`` or more."""
    handle = chat.ChatCall.handle

    async def early(self: chat.ChatCall) -> None:
        body = await self.down.read_body(self.settings.max_body_bytes)
        if len(body) < min_bytes:

            async def already_read(limit: int) -> bytes:
                return body

            self.down.read_body = already_read  # type: ignore[method-assign]
            return await handle(self)
        exchange = self.exchange
        engines = self.services.upstream
        pool = engines._connections()
        target = engines._target(engines.base_url, self.down.target)
        sent = headers.upstream_request(self.down.raw_headers, parsed_body=True)
        connection = await pool._acquire(target.origin, math.inf)
        head = http1._request_head("POST", target, sent, body)  # the whole body's length
        connection.send(head, Pieces([memoryview(body)[:-tail]]), head_only=False)
        # The proxy's own work, as in ChatCall.handle; its encode is not sent.
        payload = self.payload = self.read_request(body)
        exchange.model = str(payload.get("model") or "")
        exchange.stream = chat.streams(payload.get("stream"))
        self.turn = await self.open_session(payload)
        if self.turn is not None:
            self.turn.body_bytes = len(body)
        forwarded = await self.compact(self.rewrite(payload))
        forwarded = self.ask_for_usage(forwarded)
        if forwarded is not payload:
            self.encode(forwarded, body)
        assert connection.transport is not None
        connection.transport.write(memoryview(body)[-tail:])
        exchange.overhead_s = time.perf_counter() - exchange.started
        self.down.watch()
        asyncio.get_running_loop().call_soon(self.while_engine_reads)
        status, response_headers = await connection.head()
        response = http1.Response(status, response_headers, connection, pool)
        self.response = upstream.UpstreamResponse(
            status, response.headers, response.chunks(), response.aclose, math.inf, engines
        )
        exchange.status = status
        await self.reply_whole()

    chat.ChatCall.handle = early  # type: ignore[method-assign]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("port", type=int)
    parser.add_argument("upstream")
    parser.add_argument("--overlap", action="store_true", help="write big bodies early")
    parser.add_argument("--tail", type=int, default=TAIL, help="bytes held back (default 40000)")
    parser.add_argument("--min-bytes", type=int, default=MIN_BYTES)
    args = parser.parse_args()
    if args.overlap:
        _overlapped(args.tail, args.min_bytes)
    sys.argv = ["proxy", "serve", "--upstream", args.upstream, "--host", "127.0.0.1"]
    sys.argv += ["--port", str(args.port), "--log-level", "warning"]
    return cli.main()


if __name__ == "__main__":
    sys.exit(main())
