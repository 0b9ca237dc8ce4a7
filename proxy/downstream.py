"""The client's side of one exchange, over plain ASGI: the request body read within a
limit, the response sent, and the client leaving noticed at any point.

Kept apart from the framework so the request path (proxy.chat, proxy.passthrough) reads
as a story and can be driven by any ASGI server: a client that goes away raises
``ClientGone`` wherever the exchange stands (reading the body, waiting on the upstream,
relaying), so one ``try/finally`` there always finishes the exchange.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.errors import BodyTooLarge

Scope = Mapping[str, Any]
RawHeaders = Sequence[tuple[bytes, bytes]]

# A server extension in the scope: ``scope[CLIENT_GONE](callback)`` has the server call
# ``callback`` if the connection is lost before the response is complete (proxy.server).
CLIENT_GONE = "prefill_proxy.client_gone"


class ClientGone(Exception):
    """The client closed its connection before the exchange ended."""


class Downstream:
    """One ASGI request/response cycle: ``scope``, ``receive`` and ``send``."""

    def __init__(self, scope: Scope, receive: Any, send: Any) -> None:
        self.scope = scope
        self._receive = receive
        self._send = send
        self.gone = False  # the client left before the whole response went out
        self.started = False  # the response head went out
        self._done = False  # the whole response went out
        self._watching = False  # the client leaving cancels the exchange (``watch``)
        self._watcher: asyncio.Task[None] | None = None
        self._headers: dict[str, str] | None = None

    @property
    def method(self) -> str:
        return str(self.scope["method"])

    @property
    def raw_headers(self) -> RawHeaders:
        """The request's headers as the server gave them (read only: never changed)."""
        headers: RawHeaders = self.scope["headers"]
        return headers

    @property
    def headers(self) -> Mapping[str, str]:
        """Header names (lower case, as ASGI gives them) to values; the last one wins."""
        if self._headers is None:
            self._headers = {
                name.decode("latin-1"): value.decode("latin-1")
                for name, value in self.scope["headers"]
            }
        return self._headers

    @property
    def target(self) -> str:
        """The path as the client sent it (not decoded), with its query string."""
        path: bytes = self.scope.get("raw_path") or self.scope["path"].encode()
        query = self.scope.get("query_string") or b""
        return (path + b"?" + query if query else path).decode("latin-1")

    async def read_body(self, limit: int) -> bytes:
        """The whole body, refusing more than ``limit`` bytes before reading it all."""
        declared = self.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise BodyTooLarge(f"request body of {declared} bytes is over the {limit}-byte limit")
        parts: list[bytes] = []
        size = 0
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.gone = True
                raise ClientGone("the client left while sending its request")
            part = message.get("body", b"")
            size += len(part)
            if size > limit:
                raise BodyTooLarge(f"request body is over the {limit}-byte limit")
            parts.append(part)
            if not message.get("more_body", False):
                return b"".join(parts)

    def watch(self) -> None:
        """From now on, the client leaving cancels the task that called this (the
        exchange's): awaiting the upstream, or relaying, stops at once, and closing the
        upstream connection then makes vLLM abort. Call after the body was read. The
        proxy's server says so itself (proxy.server.CLIENT_GONE); under another, a task
        waits on ``receive()`` for the disconnect."""
        task = asyncio.current_task()
        assert task is not None
        self._watching = True
        client_gone = self.scope.get(CLIENT_GONE)
        if client_gone is not None:
            client_gone(functools.partial(self._client_gone, task))
            return
        self._watcher = asyncio.get_running_loop().create_task(self._wait_for_disconnect(task))

    async def _wait_for_disconnect(self, task: asyncio.Task[Any]) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self._client_gone(task)

    def _client_gone(self, task: asyncio.Task[Any]) -> None:
        if self._watching and not self._done:
            self.gone = True
            task.cancel()

    def cancelled_by_client(self) -> bool:
        """In an ``except CancelledError``: the cancellation was the client leaving (then
        it is taken back, so the exchange can finish its books)."""
        task = asyncio.current_task()
        if self.gone and task is not None and task.cancelling():
            task.uncancel()
            return True
        return False

    async def start(self, status: int, headers: RawHeaders) -> None:
        await self._message({"type": "http.response.start", "status": status, "headers": headers})
        self.started = True

    async def write(self, chunk: bytes) -> None:
        await self._message({"type": "http.response.body", "body": chunk, "more_body": True})

    async def end(self, chunk: bytes = b"") -> None:
        self._done = True  # a disconnect from here on no longer matters
        await self._message({"type": "http.response.body", "body": chunk, "more_body": False})

    async def respond(self, status: int, headers: RawHeaders, body: bytes) -> None:
        """A whole response at once (``headers`` without content-length: it is added)."""
        await self.start(status, [*headers, (b"content-length", str(len(body)).encode())])
        await self.end(body)

    def close(self) -> None:
        """Stop watching for the client leaving. After a whole response there is nothing
        to do: the server ends the watcher's wait itself (``receive`` answers
        ``http.disconnect`` once the response is complete), cheaper than a cancellation."""
        self._watching = False
        watcher, self._watcher = self._watcher, None
        if watcher is not None and not self._done:
            watcher.cancel()

    async def _message(self, message: dict[str, Any]) -> None:
        try:
            await self._send(message)
        except OSError as exc:  # servers on ASGI spec 2.4 report a gone client this way
            self.gone = True
            raise ClientGone("the client left during the response") from exc
