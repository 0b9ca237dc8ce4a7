"""The upstream engine: the only module that talks to backends and handles their errors.

Requests go out on the proxy's own HTTP/1.1 connection pool (proxy.http1): a proxy needs
none of a client library's per-request work, and aiohttp's cost a fifth of the proxy's CPU
on an agent step (tests/benchmarks/client_cost.py). An httpx transport given instead
(tests stand a ``MockTransport`` in for the engines) is called the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import httpx

from proxy import http1, jsonio
from proxy.config import Settings
from proxy.errors import UpstreamError, UpstreamProtocolError, UpstreamTimeout
from proxy.headers import upstream_credentials
from proxy.pieces import Body, Lead, joined

RawHeaders = Sequence[tuple[bytes, bytes]]
URLS_KEPT = 256

_FAILURES = (TimeoutError, httpx.HTTPError, OSError, http1.ProtocolError)


class Upstream:
    def __init__(self, settings: Settings, transport: httpx.AsyncBaseTransport | None = None):
        self.base_url = settings.upstream_base
        self._settings = settings
        self._total_timeout = settings.total_timeout or math.inf
        self.read_timeout = settings.read_timeout
        # The proxy's own requests without a client's credentials (/v1/models, /metrics)
        # carry the upstream's key, if it has one.
        self._own_credentials = upstream_credentials(settings.upstream_api_key)
        self._pool: http1.Pool | None = None  # made in the running loop
        self._transport = transport
        timeout = httpx.Timeout(
            connect=settings.connect_timeout,
            read=settings.read_timeout,
            write=settings.read_timeout,
            pool=settings.connect_timeout,
        )
        self._extensions = {"timeout": timeout.as_dict()}
        self._targets: dict[tuple[str, str], http1.Target] = {}

    def _connections(self) -> http1.Pool:
        if self._pool is None:
            settings = self._settings
            self._pool = http1.Pool(
                settings.max_connections,
                settings.keepalive_expiry,
                settings.connect_timeout,
                settings.read_timeout,
            )
        return self._pool

    async def aclose(self) -> None:
        if self._pool is not None:
            self._pool.close()
        if self._transport is not None:
            await self._transport.aclose()

    async def send(
        self,
        method: str,
        path: str,
        headers: RawHeaders,
        body: Body | None,
        *,
        base: str = "",
    ) -> UpstreamResponse:
        """Send a request (to engine ``base``; default: the first upstream); return as soon
        as the response headers are in.

        Raises UpstreamError (refused), UpstreamTimeout, UpstreamProtocolError (broken).
        """
        deadline = self._deadline()
        target = self._target(base or self.base_url, path)
        # No retry here: a request is sent once. The pool sends a GET again when a reused
        # keep-alive connection turns out closed; a POST (a generation) that fails so gets
        # a 502, since nothing proves the engine did not receive it (keepalive_expiry under
        # the engine's keep-alive makes that race rare).
        try:
            if self._transport is not None:
                async with asyncio.timeout_at(deadline if deadline < math.inf else None):
                    return await self._send_httpx(method, target, headers, body, deadline)
            # The pool holds the deadline itself, on timers it has anyway (a timeout_at
            # here was 1% of the CPU of a 64 KB step at c=64).
            pool = self._connections()
            response = await pool.request(method, target, headers, body, deadline)
        except _FAILURES as exc:
            raise self._translate(exc) from exc
        return self._response(response, deadline)

    def _deadline(self) -> float:
        """When an exchange starting now must end, in the event loop's clock (infinity:
        no total timeout)."""
        return asyncio.get_running_loop().time() + self._total_timeout

    def _response(self, response: http1.Response, deadline: float) -> UpstreamResponse:
        return UpstreamResponse(
            response.status, response.headers, response.chunks(), response.aclose, deadline, self
        )

    def begin(
        self,
        method: str,
        path: str,
        headers: RawHeaders,
        source: bytes,
        lead: Lead,
        *,
        base: str = "",
    ) -> Early | None:
        """Start a request with the first part of its body, ``lead`` built from ``source``
        (proxy.http1.Pool.begin); None where it cannot start at once (no idle connection to
        ``base``, or a transport given instead of the pool)."""
        if self._transport is not None:
            return None
        deadline = self._deadline()
        target = self._target(base or self.base_url, path)
        upload = self._connections().begin(method, target, headers, lead.rebuilt(source), deadline)
        if upload is None:
            return None
        return Early(upload, base, list(headers), source, lead, deadline)

    async def finish(self, early: Early, rest: Body) -> UpstreamResponse:
        """The rest of a request ``begin`` started; as ``send`` from there."""
        try:
            response = await early.upload.finish(rest)  # its head due by early.deadline
        except _FAILURES as exc:
            raise self._translate(exc) from exc
        return self._response(response, early.deadline)

    async def _send_httpx(
        self,
        method: str,
        target: http1.Target,
        headers: RawHeaders,
        body: Body | None,
        deadline: float,
    ) -> UpstreamResponse:
        origin = target.origin
        url = f"{origin.scheme}://{origin.authority.decode()}{target.path.decode('latin-1')}"
        request = httpx.Request(
            method,
            url,
            headers=headers,
            content=None if body is None else joined(body),
            extensions=self._extensions,
        )
        assert self._transport is not None
        response = await self._transport.handle_async_request(request)
        if response.is_stream_consumed:  # a transport that read it all (MockTransport)
            chunks: AsyncIterator[bytes] = _one(response.content)
        else:
            chunks = response.aiter_raw()
        return UpstreamResponse(
            response.status_code, response.headers.raw, chunks, response.aclose, deadline, self
        )

    def _target(self, base: str, path: str) -> http1.Target:
        """Where the request goes, its path as the client wrote it (nothing quoted again),
        kept for the engines' few paths."""
        target = self._targets.get((base, path))
        if target is None:
            target = http1.Target.parse(base + path)
            if len(self._targets) < URLS_KEPT:  # paths carry the client's query: bounded
                self._targets[(base, path)] = target
        return target

    async def call(
        self,
        path: str,
        payload: Any = None,
        *,
        headers: RawHeaders = (),
        timeout: float | None = None,
        base: str = "",
    ) -> tuple[int, bytes]:
        """(status, body) of a request the proxy makes on its own (warm-ups, summaries,
        /v1/models, /metrics): POST with a JSON ``payload``, GET without one. Bounded by
        ``timeout`` seconds on top of the usual limits; raises UpstreamError like send."""
        content = None if payload is None else jsonio.dumps(payload)
        sent = list(headers or self._own_credentials)
        if content is not None:
            sent.append((b"content-type", b"application/json"))
        try:
            async with asyncio.timeout(timeout):
                method = "POST" if content else "GET"
                response = await self.send(method, path, sent, content, base=base)
                try:
                    return response.status, await response.read()
                finally:
                    await response.aclose()
        except TimeoutError as exc:
            raise UpstreamTimeout(f"upstream {self.base_url} timed out on {path}") from exc

    async def probe(self, path: str) -> int:
        """Status of a GET on the upstream (for /ready)."""
        response = await self.send("GET", path, (), None)
        await response.aclose()
        return response.status

    def _translate(self, exc: BaseException) -> UpstreamError:
        root = exc.__cause__ if isinstance(exc, httpx.HTTPError) and exc.__cause__ else exc
        if isinstance(root, (TimeoutError, httpx.TimeoutException)):
            return UpstreamTimeout(f"upstream {self.base_url} timed out ({type(root).__name__})")
        if isinstance(root, (http1.ConnectError, httpx.ConnectError)):
            return UpstreamError(f"cannot connect to upstream {self.base_url}: {root}")
        return UpstreamProtocolError(f"upstream {self.base_url} broke the exchange: {root!r}")


@dataclasses.dataclass(eq=False)
class Early:
    """A request on its way before it was built whole: where it goes, with which headers,
    and how many bytes of its body are written."""

    upload: http1.Upload
    base: str
    headers: list[tuple[bytes, bytes]]
    source: bytes  # the client's body, which ``lead`` was built from
    lead: Lead
    deadline: float


class UpstreamResponse:
    """A response whose body has not been read yet."""

    def __init__(
        self,
        status: int,
        headers: RawHeaders,
        chunks: AsyncIterator[bytes],
        close: Callable[[], Awaitable[None]],
        deadline: float,
        upstream: Upstream,
    ):
        self.status = status
        self.headers = headers
        self._chunks = chunks
        self._close = close
        self._deadline = deadline
        self._upstream = upstream

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        """Body chunks as they arrive, bounded by the read and total timeouts. A read
        returns at the first bytes that arrive, and the read timeout ends one that waits
        longer: until ``read_timeout`` before the deadline, no read can outlast it, and
        none needs a timer of its own (one per chunk was 3% of the CPU of a non-streamed
        64 KB step at c=1, and a stream reads a chunk per token)."""
        chunks = self._chunks.__aiter__()
        clock = asyncio.get_running_loop().time
        deadline = self._deadline
        untimed_until = deadline - self._upstream.read_timeout  # infinity: no total timeout
        while True:
            try:
                if clock() < untimed_until:
                    chunk = await chunks.__anext__()
                else:
                    async with asyncio.timeout_at(deadline):
                        chunk = await chunks.__anext__()
            except StopAsyncIteration:
                return
            except _FAILURES as exc:
                raise self._upstream._translate(exc) from exc
            yield chunk

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iter_bytes()])

    async def aclose(self) -> None:
        """Close now; if the body was not read to the end, the connection is dropped, which
        makes vLLM abort the request and free its KV blocks."""
        # Closing a connection that is already broken: nothing is left to free.
        with contextlib.suppress(httpx.HTTPError, OSError):
            await self._close()


async def _one(content: bytes) -> AsyncIterator[bytes]:
    yield content
