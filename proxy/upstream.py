"""The upstream engine: the only module that talks to backends and handles httpx errors.

One shared ``httpx.AsyncClient`` on an aiohttp transport (``httpx-aiohttp``): httpx's API,
aiohttp's HTTP/1.1 machinery, which costs about a quarter of the CPU per proxied request
of httpx's own pure-Python transport (tests/benchmarks/overhead.py measures it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

from proxy import jsonio
from proxy.config import Settings
from proxy.errors import UpstreamError, UpstreamProtocolError, UpstreamTimeout
from proxy.headers import upstream_credentials

RawHeaders = Sequence[tuple[bytes, bytes]]
URLS_KEPT = 256


# aiohttp adds these when a request lacks them; a transparent proxy must not.
_NO_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")


def _aiohttp_transport(settings: Settings) -> AiohttpTransport:
    def session() -> aiohttp.ClientSession:  # made lazily, inside the running event loop
        connector = aiohttp.TCPConnector(
            limit=settings.max_connections, keepalive_timeout=settings.keepalive_expiry
        )
        return aiohttp.ClientSession(
            connector=connector, skip_auto_headers=_NO_AUTO_HEADERS, auto_decompress=False
        )

    return AiohttpTransport(client=session)


class Upstream:
    def __init__(self, settings: Settings, transport: httpx.AsyncBaseTransport | None = None):
        self.base_url = settings.upstream_base
        self._total_timeout = settings.total_timeout or None
        # The proxy's own requests without a client's credentials (/v1/models, /metrics)
        # carry the upstream's key, if it has one.
        self._own_credentials = upstream_credentials(settings.upstream_api_key)
        timeout = httpx.Timeout(
            connect=settings.connect_timeout,
            read=settings.read_timeout,
            write=settings.read_timeout,
            pool=settings.connect_timeout,
        )
        self._transport = transport or _aiohttp_transport(settings)
        self._extensions = {"timeout": timeout.as_dict()}
        self._urls: dict[tuple[str, str], httpx.URL] = {}
        # The shared client owns the connection pool (its transport) and closes it. Requests
        # go to the transport directly (see send), so the client's own per-request behaviour
        # (default headers, a cookie jar shared by every caller) never applies.
        self._client = httpx.AsyncClient(
            transport=self._transport, timeout=timeout, follow_redirects=False
        )

    async def aclose(self) -> None:
        await self._client.aclose()

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
        # Straight to the shared client's transport (its connection pool): a proxy needs
        # none of the client's per-request work (URL merging, cookies, auth, redirects),
        # which was about a tenth of the proxy's CPU per request (tests/benchmarks).
        request = httpx.Request(
            method,
            self._url(base or self.base_url, path),
            headers=headers,
            content=body,
            extensions=self._extensions,
        )
        # No retry here: a request is sent once. aiohttp itself sends an idempotent request
        # again when a reused keep-alive connection turns out closed; a POST (a generation)
        # that fails so gets a 502, since nothing proves the engine did not receive it
        # (keepalive_expiry under the engine's keep-alive makes that race rare).
        try:
            async with asyncio.timeout_at(deadline):
                response = await self._transport.handle_async_request(request)
        except (TimeoutError, httpx.HTTPError, aiohttp.ClientError, OSError) as exc:
            raise self._translate(exc) from exc
        return UpstreamResponse(response, deadline, self)

    def _url(self, base: str, path: str) -> httpx.URL:
        """The parsed URL, kept for the engines' few paths: parsing one takes about half
        the time of building the request around it."""
        url = self._urls.get((base, path))
        if url is None:
            url = httpx.URL(base + path)
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

    def __init__(self, response: httpx.Response, deadline: float | None, upstream: Upstream):
        self._response = response
        self._deadline = deadline
        self._upstream = upstream
        self.status = response.status_code
        self.headers: RawHeaders = response.headers.raw

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        """Body chunks as they arrive, bounded by the read and total timeouts."""
        if self._response.is_stream_consumed:  # a transport that read it all (MockTransport)
            yield self._response.content
            return
        chunks = self._response.aiter_raw().__aiter__()
        while True:
            try:
                async with asyncio.timeout_at(self._deadline):
                    chunk = await chunks.__anext__()
            except StopAsyncIteration:
                return
            except (TimeoutError, httpx.HTTPError, aiohttp.ClientError, OSError) as exc:
                raise self._upstream._translate(exc) from exc
            yield chunk

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iter_bytes()])

    async def aclose(self) -> None:
        """Close now; if the body was not read to the end, the connection is dropped, which
        makes vLLM abort the request and free its KV blocks."""
        # Closing a connection that is already broken: nothing is left to free.
        with contextlib.suppress(httpx.HTTPError, OSError):
            await self._response.aclose()
