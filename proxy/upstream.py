"""The upstream engine: the only module that talks to backends and handles their errors.

Requests go out on one shared ``aiohttp.ClientSession`` (its connection pool), directly: a
proxy needs none of a client library's per-request work, and httpx's request and response
objects around aiohttp's (``httpx-aiohttp``) cost about a tenth of a millisecond per
request (tests/benchmarks/overhead.py). An httpx transport given instead (tests stand a
``MockTransport`` in for the engines) is called the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import httpx
import yarl

from proxy import jsonio
from proxy.config import Settings
from proxy.errors import UpstreamError, UpstreamProtocolError, UpstreamTimeout
from proxy.headers import upstream_credentials

RawHeaders = Sequence[tuple[bytes, bytes]]
URLS_KEPT = 256
READ_CHUNK = 1 << 16  # the most a body chunk holds (aiohttp's read buffer)

# aiohttp adds these when a request lacks them; a transparent proxy must not.
_NO_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
_FAILURES = (TimeoutError, httpx.HTTPError, aiohttp.ClientError, OSError)


class Upstream:
    def __init__(self, settings: Settings, transport: httpx.AsyncBaseTransport | None = None):
        self.base_url = settings.upstream_base
        self._settings = settings
        self._total_timeout = settings.total_timeout or None
        self.read_timeout = settings.read_timeout
        # The proxy's own requests without a client's credentials (/v1/models, /metrics)
        # carry the upstream's key, if it has one.
        self._own_credentials = upstream_credentials(settings.upstream_api_key)
        self._timeout = aiohttp.ClientTimeout(
            sock_connect=settings.connect_timeout,
            sock_read=settings.read_timeout,
            connect=settings.connect_timeout,  # waiting for a connection of the pool too
        )
        self._session: aiohttp.ClientSession | None = None  # made in the running loop
        self._transport = transport
        timeout = httpx.Timeout(
            connect=settings.connect_timeout,
            read=settings.read_timeout,
            write=settings.read_timeout,
            pool=settings.connect_timeout,
        )
        self._extensions = {"timeout": timeout.as_dict()}
        self._urls: dict[tuple[str, str], yarl.URL] = {}

    def _pool(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._settings.max_connections,
                keepalive_timeout=self._settings.keepalive_expiry,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                skip_auto_headers=_NO_AUTO_HEADERS,
                auto_decompress=False,
                # No cookie jar: a cookie the upstream sets is the client's it answered,
                # never sent along with every other client's requests.
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._transport is not None:
            await self._transport.aclose()

    async def send(
        self,
        method: str,
        path: str,
        headers: RawHeaders,
        body: bytes | None,
        *,
        base: str = "",
    ) -> UpstreamResponse:
        """Send a request (to engine ``base``; default: the first upstream); return as soon
        as the response headers are in.

        Raises UpstreamError (refused), UpstreamTimeout, UpstreamProtocolError (broken).
        """
        deadline = None
        if self._total_timeout is not None:  # in the event loop's clock, as timeout_at wants
            deadline = asyncio.get_running_loop().time() + self._total_timeout
        url = self._url(base or self.base_url, path)
        # No retry here: a request is sent once. aiohttp itself sends an idempotent request
        # again when a reused keep-alive connection turns out closed; a POST (a generation)
        # that fails so gets a 502, since nothing proves the engine did not receive it
        # (keepalive_expiry under the engine's keep-alive makes that race rare).
        try:
            async with asyncio.timeout_at(deadline):
                if self._transport is not None:
                    return await self._send_httpx(method, url, headers, body, deadline)
                response = await self._pool().request(
                    method,
                    url,
                    headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers],
                    data=body or None,
                    allow_redirects=False,
                    timeout=self._timeout,
                )
        except _FAILURES as exc:
            raise self._translate(exc) from exc
        return UpstreamResponse(
            response.status,
            response.raw_headers,
            response.content.iter_chunked(READ_CHUNK),
            lambda: _release(response),
            deadline,
            self,
        )

    async def _send_httpx(
        self,
        method: str,
        url: yarl.URL,
        headers: RawHeaders,
        body: bytes | None,
        deadline: float | None,
    ) -> UpstreamResponse:
        request = httpx.Request(
            method, str(url), headers=headers, content=body, extensions=self._extensions
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

    def _url(self, base: str, path: str) -> yarl.URL:
        """The URL as the client wrote its path (``encoded``: nothing re-quoted), kept for
        the engines' few paths: parsing one costs about as much as sending the request."""
        url = self._urls.get((base, path))
        if url is None:
            url = yarl.URL(base + path, encoded=True)
            if len(self._urls) < URLS_KEPT:  # paths carry the client's query: bounded
                self._urls[(base, path)] = url
        return url

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
        if isinstance(root, (aiohttp.ClientConnectorError, httpx.ConnectError)):
            return UpstreamError(f"cannot connect to upstream {self.base_url}: {root}")
        return UpstreamProtocolError(f"upstream {self.base_url} broke the exchange: {root!r}")


class UpstreamResponse:
    """A response whose body has not been read yet."""

    def __init__(
        self,
        status: int,
        headers: RawHeaders,
        chunks: AsyncIterator[bytes],
        close: Callable[[], Awaitable[None]],
        deadline: float | None,
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
        untimed_until = math.inf if deadline is None else deadline - self._upstream.read_timeout
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
        with contextlib.suppress(httpx.HTTPError, aiohttp.ClientError, OSError):
            await self._close()


async def _release(response: aiohttp.ClientResponse) -> None:
    """The connection back to the pool when the body was read to its end, else closed."""
    if response.content.at_eof():
        response.release()
    else:
        response.close()


async def _one(content: bytes) -> AsyncIterator[bytes]:
    yield content
