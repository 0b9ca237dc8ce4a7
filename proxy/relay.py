"""Relaying an upstream response to the client: bytes as they arrive, timed, closed on exit."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from proxy import jsonio, sse
from proxy.chunks import ReplyAssembler, carries_token
from proxy.errors import ProxyError, UpstreamError, UpstreamProtocolError, sse_error_event
from proxy.exchange import Exchange
from proxy.upstream import UpstreamResponse


class StreamWatcher(Protocol):
    """Reads a stream's events as they pass (ChatStreamWatcher, and the Responses one in
    proxy.responses.events): what ``relay_chunks`` needs of it."""

    error: Any
    reply_ready: bool

    @property
    def reply_too_long(self) -> bool: ...

    def relay(self, chunk: bytes, now: float) -> bytes: ...

    def flush(self) -> bytes: ...

    async def deliver_reply(self) -> None: ...

    def error_event(self, error: ProxyError) -> bytes: ...


class EventWatcher:
    """What both stream watchers share: the events split as they come, and the reply
    handed on once (``on_reply``) before the client can act on the event that completes
    it: the client sends its next request the moment it sees it, and that must find the
    session (proxy.call.Call.relay)."""

    def __init__(
        self,
        exchange: Exchange,
        on_reply: Callable[[], Awaitable[None]] | None,
        max_event: int | None,
    ) -> None:
        self._exchange = exchange
        self._on_reply = on_reply
        self._splitter = sse.EventSplitter(max_event)
        self.error: Any = None
        self.reply_ready = False  # the reply is complete: deliver_reply before relaying on

    async def deliver_reply(self) -> None:
        """Hand the complete reply on (once)."""
        if self._on_reply is not None:
            on_reply, self._on_reply = self._on_reply, None
            self.reply_ready = False
            await on_reply()


class ChatStreamWatcher(EventWatcher):
    """Reads each event of a chat-completion stream as it passes (no I/O): marks token
    times and usage on the exchange and, when the proxy asked for usage on the client's
    behalf, makes the stream what the client would have had without that request.

    vLLM, asked for usage, moves ``system_fingerprint`` from the terminal chunks (those
    with a ``finish_reason``) to the extra usage-only chunk (vllm/entrypoints/openai/
    chat_completion/serving.py). So terminal chunks are held until the next event: if it
    is the usage chunk, it is dropped and its fingerprint put back where vLLM puts it
    without usage, as the last field. Terminal chunks come last, so holding them delays
    no token. Every other byte is forwarded unchanged."""

    def __init__(
        self,
        exchange: Exchange,
        *,
        strip_usage: bool,
        on_reply: Callable[[], Awaitable[None]] | None = None,
        max_event: int | None = None,
        max_reply_chars: int | None = None,
    ) -> None:
        super().__init__(exchange, on_reply, max_event)  # the reply: at [DONE]
        self._strip_usage = strip_usage
        self._assembler = ReplyAssembler(max_reply_chars) if on_reply is not None else None
        self._held: list[bytes] = []

    def relay(self, chunk: bytes, now: float) -> bytes:
        out: list[bytes] = []
        for event in self._splitter.feed(chunk):
            self._route(event, now, out)
        return b"".join(out)

    def flush(self) -> bytes:
        """At the end of the stream: what was held back."""
        rest = b"".join(self._held) + self._splitter.flush()
        self._held = []
        return rest

    @property
    def reply_too_long(self) -> bool:
        return self._assembler is not None and self._assembler.too_long

    def _reply_complete(self) -> None:
        if self._assembler is not None and self._on_reply is not None:
            self._exchange.reply = self._assembler.message()
            self.reply_ready = True

    def error_event(self, error: ProxyError) -> bytes:
        return sse_error_event(error)

    def _route(self, event: bytes, now: float, out: list[bytes]) -> None:
        data = sse.event_data(event)
        payload = sse.json_object(data)
        if payload is None:
            if data == sse.DONE:
                self._reply_complete()
            out.extend(self._held)
            self._held = []
            out.append(event)
            return
        if "error" in payload:
            self.error = payload["error"]
        if self._assembler is not None:
            self._assembler.feed(payload)
        usage = payload.get("usage")
        if isinstance(usage, dict):
            self._exchange.usage = usage
        choices = payload.get("choices")
        if choices and any(carries_token(choice) for choice in choices):
            self._exchange.mark_token(now)
        if not self._strip_usage:
            out.append(event)
        elif not choices and isinstance(usage, dict):  # the usage chunk we asked for
            fingerprint = payload.get("system_fingerprint")
            out.extend(_with_fingerprint(held, fingerprint) for held in self._held)
            self._held = []
        elif choices and any(_finished(choice) for choice in choices):
            self._held.append(event)
        else:
            out.extend(self._held)
            self._held = []
            out.append(event)


def _finished(choice: Any) -> bool:
    return isinstance(choice, dict) and choice.get("finish_reason") is not None


def _with_fingerprint(event: bytes, fingerprint: Any) -> bytes:
    if (
        not isinstance(fingerprint, str)
        or b'"system_fingerprint"' in event
        or not event.endswith(b"}\n\n")
    ):
        return event
    return event[:-3] + b',"system_fingerprint":' + jsonio.dumps(fingerprint) + b"}\n\n"


async def relay_chunks(
    upstream: UpstreamResponse,
    exchange: Exchange,
    watcher: StreamWatcher | None,
    *,
    deliver: bool = True,
) -> AsyncIterator[bytes]:
    """The upstream body, chunk by chunk. A failure mid-stream ends a chat stream with an
    OpenAI-style error event instead of a hang or a silent cut; a body not read event by
    event raises, and the call ends it (proxy.call.Call.fail: the same event for any event
    stream, a cut otherwise). The watcher's reply is handed on as it completes, before
    the chunk that completes it; with ``deliver`` false, by the caller."""
    try:
        async for chunk in upstream.iter_bytes():
            if watcher is not None:
                try:
                    chunk = watcher.relay(chunk, time.perf_counter())
                except sse.EventTooLarge as exc:
                    raise UpstreamProtocolError(f"the upstream broke the stream: {exc}") from exc
                if deliver and watcher.reply_ready:
                    await watcher.deliver_reply()
            if chunk:
                yield chunk
        if watcher is not None and (rest := watcher.flush()):
            yield rest
        if watcher is not None and watcher.error is not None:
            exchange.error_kind = "stream_error"
    except UpstreamError as error:
        exchange.error_kind = error.kind
        if watcher is None:
            raise
        yield watcher.error_event(error)
