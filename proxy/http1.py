"""The engines' HTTP/1.1 client: kept-alive connections per engine (proxy.http1_connection:
each request written in one call, each response parsed by httptools), at most so many open.

What a proxy in front of engines needs and nothing more: no cookies, redirects,
decompression, proxies or retries of requests that may have reached the engine. aiohttp,
called as proxy.upstream called it, took 0.25-0.32 ms of CPU per request; the least an
asyncio client can do, 0.05-0.10 ms (tests/benchmarks/client_cost.py, run on aiohttp):
a fifth of the proxy's CPU on a 64 KB agent step. No I/O but the sockets it opens.

A request's body may also go in chunks (``Pool.begin``): its first part on the wire while
the proxy still builds the rest.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import math
import ssl
import urllib.parse
from collections.abc import AsyncIterator

from proxy.http1_connection import (
    ConnectError,
    Connection,
    HeadTimeout,
    Origin,
    ProtocolError,
    RawHeaders,
    ReadTimeout,
    StaleConnection,
)
from proxy.pieces import Body, Pieces

__all__ = [
    "IDEMPOTENT",
    "ConnectError",
    "HeadTimeout",
    "Origin",
    "Pool",
    "ProtocolError",
    "ReadTimeout",
    "Response",
    "Target",
    "Upload",
]
# A request that fails this way on a connection reused from the pool never reached a
# server that was still listening: sent again once, for the methods safe to send twice.
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS"})
_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})


@dataclasses.dataclass(frozen=True)
class Target:
    origin: Origin
    path: bytes  # the request target, as written (nothing quoted again)

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        default = 443 if parts.scheme == "https" else 80
        port = parts.port or default
        authority = parts.netloc.rpartition("@")[2]
        origin = Origin(parts.scheme, parts.hostname, port, authority.encode("idna"))
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return cls(origin, path.encode("latin-1"))


class Pool:
    """Connections to the engines, at most ``limit`` open at once; an idle one is kept
    ``keepalive_expiry`` seconds (under the engine's own keep-alive, so a request never
    goes out on a connection the engine is closing)."""

    def __init__(
        self,
        limit: int,
        keepalive_expiry: float,
        connect_timeout: float,
        read_timeout: float,
    ) -> None:
        self._limit = limit
        self._keepalive = keepalive_expiry
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._idle: dict[Origin, list[Connection]] = {}
        self._open = 0
        self._freed: collections.deque[asyncio.Future[None]] = collections.deque()
        self._tls: ssl.SSLContext | None = None

    async def request(
        self,
        method: str,
        target: Target,
        headers: RawHeaders,
        body: Body | None,
        deadline: float = math.inf,
    ) -> Response:
        """Send a request; return once its response head is in, by ``deadline`` (in the
        loop's clock). Raises ConnectError, TimeoutError (ReadTimeout, HeadTimeout),
        ProtocolError."""
        head = _request_head(method, target, headers, body)
        for attempt in (1, 2):
            connection = await self._acquire(target.origin, deadline)
            try:
                connection.send(head, body, head_only=method == "HEAD", head_by=deadline)
                status, response_headers = await connection.head()
            except StaleConnection:
                self._discard(connection)
                if attempt == 1 and method in IDEMPOTENT:
                    continue  # the engine closed it as it was reused: nothing reached it
                raise
            except BaseException:
                self._discard(connection)
                raise
            return Response(status, response_headers, connection, self)
        raise AssertionError("unreachable")

    def begin(
        self,
        method: str,
        target: Target,
        headers: RawHeaders,
        first: Body,
        deadline: float = math.inf,
    ) -> Upload | None:
        """Start a request whose body goes in chunks (Transfer-Encoding: chunked), ``first``
        written now, on a kept-alive connection to the target's engine; None where none is
        idle (not worth a wait or a connect: the request then goes as usual). Its response
        head is due by ``deadline``."""
        connection = self._kept(target.origin, asyncio.get_running_loop().time())
        if connection is None:
            return None
        head = _request_head(method, target, headers, None, chunked=True)
        try:
            connection.send(head, Pieces(_chunk(first)), head_only=False, head_by=deadline)
        except StaleConnection:
            self._discard(connection)
            return None
        return Upload(connection, self)

    async def _acquire(self, origin: Origin, deadline: float) -> Connection:
        """A kept-alive connection to ``origin``, else a new one once there is room (an
        idle one to another engine closed for it, or one freed): within connect_timeout,
        and by ``deadline``."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        connection = self._kept(origin, now)
        if connection is not None:
            return connection
        async with asyncio.timeout_at(min(now + self._connect_timeout, deadline)):
            while self._open >= self._limit and not self._close_an_idle():
                waiter = loop.create_future()
                self._freed.append(waiter)
                await waiter
                connection = self._kept(origin, loop.time())
                if connection is not None:
                    return connection
            self._open += 1
            try:
                return await self._connect(loop, origin)
            except BaseException:
                self._open -= 1
                self._wake_one()
                raise

    def _kept(self, origin: Origin, now: float) -> Connection | None:
        """The most recently used idle connection to ``origin`` that is still fresh."""
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            usable = connection.transport is not None and not connection.transport.is_closing()
            if usable and not connection.closed and now - connection.idle_since < self._keepalive:
                connection.reused = True
                return connection
            self._discard(connection)
        return None

    async def _connect(self, loop: asyncio.AbstractEventLoop, origin: Origin) -> Connection:
        tls = None
        if origin.scheme == "https":
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        try:
            _, connection = await loop.create_connection(
                lambda: Connection(loop, origin, self._read_timeout),
                origin.host,
                origin.port,
                ssl=tls,
                server_hostname=origin.host if tls else None,
            )
        except (OSError, ssl.SSLError) as exc:
            raise ConnectError(f"{origin.host}:{origin.port}: {exc}") from exc
        return connection

    def release(self, connection: Connection) -> None:
        """A response is done with its connection: kept for the next request, or closed."""
        if connection.reusable():
            connection.idle_since = asyncio.get_running_loop().time()
            self._idle.setdefault(connection.origin, []).append(connection)
            self._wake_one()
        else:
            self._discard(connection)

    def _discard(self, connection: Connection) -> None:
        connection.close()
        if connection.counted:
            connection.counted = False
            self._open -= 1
            self._wake_one()

    def _close_an_idle(self) -> bool:
        for origin, idle in self._idle.items():
            if idle:
                self._discard(idle.pop(0))
                if not idle:
                    del self._idle[origin]
                return True
        return False

    def _wake_one(self) -> None:
        while self._freed:
            waiter = self._freed.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()


class Upload:
    """A request whose body is still being written: its last part and its response
    (``finish``), or dropped (``abort``). Until its last chunk, the engine holds no whole
    request, so it has run none: one dropped, or whose connection closed, may go again."""

    def __init__(self, connection: Connection, pool: Pool) -> None:
        self._connection: Connection | None = connection
        self._pool = pool

    def writable(self) -> bool:
        """Whether the connection is still there to finish on (the engine may have closed
        it as it was reused, or answered early and closed it)."""
        connection = self._connection
        if connection is None or connection.closed or connection.transport is None:
            return False
        return not connection.transport.is_closing()

    async def finish(self, rest: Body) -> Response:
        """Write ``rest`` and the end of the body; return once the response head is in."""
        connection, self._connection = self._connection, None
        assert connection is not None and connection.transport is not None
        connection.transport.writelines([*_chunk(rest), b"0\r\n\r\n"])
        try:
            status, headers = await connection.head()
        except BaseException:
            self._pool._discard(connection)
            raise
        return Response(status, headers, connection, self._pool)

    def abort(self) -> None:
        """Drop the request: its connection is closed, and the engine never saw its end."""
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool._discard(connection)


class Response:
    """A response whose head is in; its body read with ``chunks``, then ``aclose``."""

    def __init__(
        self, status: int, headers: list[tuple[bytes, bytes]], connection: Connection, pool: Pool
    ) -> None:
        self.status = status
        self.headers = headers
        self._connection: Connection | None = connection
        self._pool = pool

    async def chunks(self) -> AsyncIterator[bytes]:
        connection = self._connection
        if connection is None:
            return
        while (chunk := await connection.next_chunk()) is not None:
            yield chunk

    async def aclose(self) -> None:
        """The connection back to the pool when the body was read to its end, else closed
        (an engine aborts a request whose connection closes)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            self._pool.release(connection)


def _chunk(data: Body) -> list[bytes | memoryview]:
    """``data`` as one chunk of a chunked body (none where empty: that would end it)."""
    if not data:
        return []
    parts = data.parts if isinstance(data, Pieces) else (data,)
    return [b"%x\r\n" % len(data), *parts, b"\r\n"]


def _request_head(
    method: str, target: Target, headers: RawHeaders, body: Body | None, *, chunked: bool = False
) -> bytes:
    """Request line and headers: the caller's (hop-by-hop ones already dropped, proxy.headers),
    then Host and the body's length, or that the body comes in chunks."""
    parts = [
        b"%s %s HTTP/1.1\r\nhost: %s\r\n" % (method.encode(), target.path, target.origin.authority)
    ]
    for name, value in headers:
        parts += (name, b": ", value, b"\r\n")
    if chunked:
        parts.append(b"transfer-encoding: chunked\r\n")
    elif body is not None or method in _WITH_BODY:
        parts.append(b"content-length: %d\r\n" % (0 if body is None else len(body)))
    parts.append(b"\r\n")
    return b"".join(parts)
