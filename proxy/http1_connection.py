"""One kept-alive HTTP/1.1 connection to an engine: a request written in one call, its
response parsed by httptools (the parser uvicorn reads requests with) as it arrives.

One response at a time: its head (a future), then its body chunks as they arrive (paused
reading past BUFFERED bytes not yet taken). The read timeout is one timer per connection,
moved on lazily: data arriving costs a float assignment, not a timer, and a response read
to its end leaves it pending for the next request on the connection (one timer per read
timeout, not two heap operations per request). The same timer bounds the wait for a
response's head by the caller's deadline (``head_by``), so a request needs no timer of its
own. proxy.http1 keeps these connections in a pool.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import math
from collections.abc import Sequence

import httptools

from proxy.pieces import Body, Pieces

RawHeaders = Sequence[tuple[bytes, bytes]]
# Body bytes held for the reader before the connection stops reading (the engine waits).
BUFFERED = 1 << 20


class ConnectError(OSError):
    """No connection to the engine (refused, name not found, TLS failed, timed out)."""


class ReadTimeout(TimeoutError):
    """No bytes from the engine for the read timeout."""


class HeadTimeout(TimeoutError):
    """No whole response head from the engine by the request's deadline."""


class ProtocolError(Exception):
    """The engine broke the exchange: a reset, a cut body, bytes that are not HTTP."""


class StaleConnection(ProtocolError):
    """A reused connection closed before any byte of the response."""


@dataclasses.dataclass(frozen=True)
class Origin:
    scheme: str
    host: str  # as connected to (no brackets around an IPv6 address)
    port: int
    authority: bytes  # the Host header


class Connection(asyncio.Protocol):
    """One connection to an engine and the response it is reading."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, origin: Origin, read_timeout: float
    ) -> None:
        self._loop = loop
        self.origin = origin
        self._read_timeout = read_timeout
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.counted = True  # among the pool's open connections
        self.idle_since = 0.0
        self.reused = False
        # The response being read.
        self._head: asyncio.Future[tuple[int, list[tuple[bytes, bytes]]]] | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._complete = False
        self._keep_alive = False
        self._informational = False
        self._head_only = False  # a response to HEAD: no body, whatever its length says
        self._until_close = False  # a body that ends when the connection does
        self._paused = False
        self._last_data = 0.0
        self._head_by = math.inf
        self._timer: asyncio.TimerHandle | None = None

    # -- asyncio ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self._last_data = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ProtocolError(f"not HTTP: {exc}"))
            self.close()

    def eof_received(self) -> bool:
        self.closed = True  # the engine is done with this connection: not reused
        return False  # the transport closes; connection_lost ends a response read till now

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timer()
        if self._head is None or self._complete:
            return
        if self._until_close and self._head.done() and exc is None:
            self.on_message_complete()  # the body was everything until the close
            return
        if not self._head.done() and self.reused and not self._headers:
            self._fail(StaleConnection("the kept-alive connection was closed"))
        else:
            self._fail(ProtocolError(f"connection closed mid-response ({exc or 'EOF'})"))

    def pause_writing(self) -> None:  # the body waits in the transport's buffer
        pass

    def resume_writing(self) -> None:
        pass

    # -- httptools callbacks -----------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # 100 Continue and the like: not the answer
            self._informational = True
            self._headers = []
            return
        headers, self._headers = self._headers, []
        lengths = {name.lower() for name, _ in headers} & {b"content-length", b"transfer-encoding"}
        self._until_close = not lengths and status not in (204, 304) and not self._head_only
        if self._head is not None and not self._head.done():
            self._head.set_result((status, headers))
        if self._head_only:
            self._complete = True
            self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > BUFFERED and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        self._complete = True
        # llhttp knows it only until it resets for the next message.
        self._keep_alive = self._parser.should_keep_alive()
        self._wake()  # the timer stays: it finds the response complete, or the next one

    # -- the exchange ----------------------------------------------------------------

    def send(
        self, head: bytes, body: Body | None, *, head_only: bool, head_by: float = math.inf
    ) -> None:
        """Write a request; its response starts being read, its head due by ``head_by``
        (in the loop's clock) or HeadTimeout."""
        assert self.transport is not None
        if self.closed or self.transport.is_closing():
            raise StaleConnection("the kept-alive connection is closing")
        self._head = self._loop.create_future()
        self._headers, self._chunks, self._buffered = [], collections.deque(), 0
        self._error, self._complete, self._informational = None, False, False
        self._keep_alive = False
        self._head_only, self._until_close = head_only, False
        self._last_data = self._loop.time()
        self._head_by = head_by
        self._arm(min(self._last_data + self._read_timeout, head_by))
        if isinstance(body, Pieces):  # one writev: the pieces are not joined first
            self.transport.writelines([head, *body.parts])
        elif body:
            self.transport.writelines([head, body])
        else:
            self.transport.write(head)

    async def head(self) -> tuple[int, list[tuple[bytes, bytes]]]:
        assert self._head is not None
        return await self._head

    async def next_chunk(self) -> bytes | None:
        """The next piece of the body; None at its end."""
        while True:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                if self._paused and self._buffered <= BUFFERED // 2 and self.transport:
                    self._paused = False
                    self.transport.resume_reading()
                return chunk
            if self._error is not None:
                raise self._error
            if self._complete:
                return None
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def reusable(self) -> bool:
        """Whether the response was read to its end and the connection can serve another."""
        return (
            self._complete
            and not self._chunks
            and not self.closed
            and not self._head_only
            and not self._until_close
            and self._keep_alive
        )

    def close(self) -> None:
        self.closed = True
        self._stop_timer()
        if self.transport is not None:
            self.transport.close()

    # --

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
            self._head.exception()  # retrieved: a request cancelled meanwhile logs nothing
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _arm(self, when: float) -> None:
        """The timer due at ``when`` at the latest (one pending earlier is left)."""
        if self._timer is not None:
            if self._timer.when() <= when:
                return
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._check_timeout)

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check_timeout(self) -> None:
        self._timer = None
        if self._complete or self.closed:
            return  # idle, or a response read to its end: the next request arms it again
        now = self._loop.time()
        heading = self._head is not None and not self._head.done()
        if heading and now >= self._head_by:
            error: TimeoutError = HeadTimeout("no response head from the engine by the deadline")
        elif now >= self._last_data + self._read_timeout:
            error = ReadTimeout(f"no bytes from the engine for {self._read_timeout:g} s")
        else:  # bytes came meanwhile: wait from the last of them
            due = self._last_data + self._read_timeout
            self._arm(min(due, self._head_by) if heading else due)
            return
        self._fail(error)
        self.close()
