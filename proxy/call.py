"""One proxied request from the client's first byte to its last, whatever the route.

``Call.run`` is the one ``try/finally`` of an exchange: whatever happens (the client gone
while sending its body, while the upstream thinks, or mid-stream; an upstream error; a
bug) the upstream connection is closed, the client gets an OpenAI-style error if it is
still there and nothing was sent yet, and the exchange is recorded exactly once (in-flight
gauge, metrics, access line). Subclasses say what the request is (``handle``): the chat
story in proxy.chat, plain forwarding in proxy.passthrough.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time

from proxy import headers as hdrs
from proxy import jsonio, pieces
from proxy.config import Settings
from proxy.downstream import ClientGone, Downstream
from proxy.engines import Engine, Engines
from proxy.errors import (
    InternalError,
    ProxyError,
    ShuttingDown,
    Unauthorized,
    UpstreamError,
    sse_error_event,
)
from proxy.exchange import Recorder
from proxy.failopen import FailOpenLog
from proxy.pieces import Body, Lead, joined
from proxy.relay import StreamWatcher, relay_chunks
from proxy.upstream import Early, RawHeaders, Upstream, UpstreamResponse

JSON = b"application/json"
# Chunks after the one that completes a stream's reply held for the end of the response
# (Call.relay); an engine sends its end right after that one.
MAX_HELD_CHUNKS = 8
log = logging.getLogger("prefill_proxy.call")
# Prompt and completion text: only with the log_bodies setting (debugging).
body_log = logging.getLogger("prefill_proxy.bodies")


@dataclasses.dataclass(frozen=True)
class Services:
    """What every call needs, built once by the app."""

    settings: Settings
    upstream: Upstream
    recorder: Recorder
    # A bug's traceback once per kind, then a line at most a minute (a request that
    # triggers it every time must not flood the log).
    bugs: FailOpenLog = dataclasses.field(
        default_factory=lambda: FailOpenLog(log, outcome="answered 500 internal_error")
    )
    # The client keys (api_keys) as bytes; empty: no check.
    keys: tuple[bytes, ...] = ()
    # The engines behind the upstream setting (one, usually).
    engines: Engines | None = None


class Call:
    route = "other"

    def __init__(self, services: Services, down: Downstream, route: str | None = None) -> None:
        self.services = services
        self.settings = services.settings
        self.down = down
        self.exchange = services.recorder.begin(route or self.route, down.method)
        self.response: UpstreamResponse | None = None
        self.engine: Engine | None = None  # where the request went, while it is there
        self.early: Early | None = None  # the request begun before it was built (begin_early)
        self.sent_to: str | None = None  # the engine the request went to (its URL; "": the one)
        self.early_discarded = False
        self._recorded = False

    async def run(self) -> None:
        try:
            keys = self.services.keys
            if keys and not hdrs.key_allowed(self.down.raw_headers, keys):
                raise Unauthorized("a valid API key is required (Authorization: Bearer KEY)")
            await self.handle()
        except ClientGone:
            pass
        except ProxyError as error:
            await self.fail(error)
        except asyncio.CancelledError as exc:
            if self.down.cancelled_by_client():
                pass
            elif _being_cancelled():
                # The server stopping after its grace period: the client still hears why.
                with contextlib.suppress(Exception):
                    await self.fail(ShuttingDown("the proxy is shutting down"))
                raise
            else:  # a cancelled task awaited on this request's behalf: an error, not ours
                await self._bug(exc)
        except Exception as exc:  # a bug: the client still gets an answer, the log a traceback
            await self._bug(exc)
        finally:
            if self.early is not None:  # never finished: the engine holds half a request
                self.early.upload.abort()
            self.down.close()
            if self.response is not None:
                # No shield needed: the connection is released before aclose's first await.
                await self.response.aclose()
            if self.engine is not None:
                self.engine.in_flight -= 1
            self.exchange.client_disconnected = self.down.gone
            self.record()

    async def handle(self) -> None:
        raise NotImplementedError

    async def _bug(self, exc: BaseException) -> None:
        self.services.bugs.failed(f"{self.down.method} {self.exchange.route}", exc)
        self.services.recorder.metrics.internal_errors.labels(self.exchange.route).inc()
        await self.fail(InternalError("the proxy failed on this request"))

    def record(self) -> None:
        """Record the exchange (once): subclasses add what follows a reply first."""
        if not self._recorded:
            self._recorded = True
            self.services.recorder.finish(self.exchange)

    # -- the upstream --------------------------------------------------------------------

    async def send(self, content: Body | None, *, parsed_body: bool) -> UpstreamResponse:
        """Forward the request; from here on a client leaving cancels the wait or the relay
        (closing the upstream connection, so vLLM aborts)."""
        exchange = self.exchange
        upstream_headers = self.upstream_headers(parsed_body=parsed_body)
        if extra := self.routing_headers():
            names = {name for name, _ in extra}
            upstream_headers = [h for h in upstream_headers if h[0].lower() not in names] + extra
        # Time held behind a fan-out leader is waiting by design, not the proxy's cost.
        exchange.overhead_s = time.perf_counter() - exchange.started - exchange.held_s
        self.down.watch()
        # Runs once the request is written, as this call starts waiting for the answer.
        asyncio.get_running_loop().call_soon(self.while_engine_reads)
        try:
            response = await self._send_to_engine(upstream_headers, content)
        except UpstreamError as error:
            exchange.error_kind = error.kind
            raise
        self.response = response
        exchange.status = response.status
        if response.status >= 400:
            exchange.error_kind = f"status_{response.status // 100}xx"
        return response

    def upstream_headers(self, *, parsed_body: bool) -> list[tuple[bytes, bytes]]:
        """The client's headers as the engine gets them (routing headers aside)."""
        headers = hdrs.upstream_request(self.down.raw_headers, parsed_body=parsed_body)
        if self.settings.upstream_api_key:
            headers = hdrs.with_upstream_key(headers, self.settings.upstream_api_key)
        return headers

    def begin_early(self, body: bytes, lead: Lead, base: str) -> None:
        """Start the request with ``lead`` (built from the client's ``body``), what the body
        it forwards most likely begins with, to engine ``base`` ("": the one upstream),
        while the rest is still being built; finished only if the request built then does
        begin so and goes there (``_finish_early``)."""
        headers = self.upstream_headers(parsed_body=True)
        method, target = self.down.method, self.down.target
        self.early = self.services.upstream.begin(method, target, headers, body, lead, base=base)

    async def _finish_early(
        self, headers: RawHeaders, content: Body | None, base: str
    ) -> UpstreamResponse | None:
        """The request begun early, finished, if ``content`` starts with the bytes it was
        begun with and goes to ``base`` with ``headers``; else None, and the early one is
        dropped (the engine never saw its end)."""
        early, self.early = self.early, None
        if early is None:
            return None
        rest = None
        if content is not None and early.base == base and early.headers == list(headers):
            rest = pieces.after(content, early.source, early.lead)
        counted = self.services.recorder.metrics.early_uploads
        if rest is None or not early.upload.writable():
            early.upload.abort()
            self.early_discarded = True
            counted.labels("discarded").inc()
            return None
        counted.labels("used").inc()
        return await self.services.upstream.finish(early, rest)

    async def _send_to_engine(self, headers: RawHeaders, content: Body | None) -> UpstreamResponse:
        upstream, engines = self.services.upstream, self.services.engines
        method, target = self.down.method, self.down.target
        engine = None if engines is None else self.choose_engine()
        base = self.sent_to = "" if engine is None else engine.url
        try:
            response = await self._finish_early(headers, content, base)
            if response is None:
                response = await upstream.send(method, target, headers, content, base=base)
        except UpstreamError as error:
            if engines is None or error.kind != "connect" or not engines.probed:
                raise
            # Refused before anything was sent: no generation to duplicate. The engine is
            # skipped from now on, and the request goes where its session moves (once).
            assert engine is not None
            engines.refused(engine)
            engine = self.choose_engine()
            self.sent_to = engine.url
            response = await upstream.send(method, target, headers, content, base=engine.url)
        if engine is not None:
            engine.in_flight += 1
            self.engine = engine
            self.services.recorder.metrics.engine_requests.labels(engine.url).inc()
        return response

    def while_engine_reads(self) -> None:
        """Work for the time the engine reads the request (none here): it must not wait."""

    def routing_headers(self) -> list[tuple[bytes, bytes]]:
        """Headers for a router in front of the engines (upstream_session_header)."""
        return []

    def choose_engine(self) -> Engine:
        """The engine for this request: a request without a session, the least loaded."""
        assert self.services.engines is not None
        return self.services.engines.for_request()

    def response_headers(self, *, keep_length: bool = True) -> list[tuple[bytes, bytes]]:
        assert self.response is not None
        return hdrs.client_response(
            self.response.headers, self.exchange.overhead_ms_header, keep_length=keep_length
        )

    async def relay(
        self, headers: list[tuple[bytes, bytes]], watcher: StreamWatcher | None = None
    ) -> None:
        """The upstream body to the client as it arrives; recorded before anything else
        runs after the last message, so a client that saw the end also sees this request
        in /metrics.

        The watcher's reply goes into its session before the client can send its next
        request: where the store never waits (``reply_after_end``), the event that
        completes the reply, and what follows it (the engine's end comes right after),
        are held and go out with the end of the response, and the reply is handed on
        then, with nothing yielding in between; the client has its whole answer without
        waiting for that bookkeeping. Otherwise it is handed on before that event."""
        assert self.response is not None
        await self.down.start(self.exchange.status, headers)
        # The watcher whose reply is handed on after the end (None: before its event).
        later = watcher if watcher is not None and self.reply_after_end() else None
        held: list[bytes] = []
        try:
            chunks = relay_chunks(self.response, self.exchange, watcher, deliver=later is None)
            async for chunk in chunks:
                if later is not None and later.reply_ready:
                    held.append(chunk)
                    if len(held) < MAX_HELD_CHUNKS:
                        continue
                    await later.deliver_reply()  # an engine that goes on: as without
                    later, chunk, held = None, b"".join(held), []
                await self.down.write(chunk)
            if later is None:
                self.record()
            await self.down.end(b"".join(held))
        finally:
            if later is not None and later.reply_ready:
                await later.deliver_reply()
        # Held to the end: recorded after the reply, as a whole reply is (the exchange in
        # flight while its reply is handed on), with nothing yielding since the end.
        self.record()

    def reply_after_end(self) -> bool:
        """Whether a stream's reply may be handed on after the response ends (relay)."""
        return False

    async def read(self) -> bytes:
        """The upstream body whole (a non-streamed reply)."""
        assert self.response is not None
        try:
            return await self.response.read()
        except UpstreamError as error:
            self.exchange.error_kind = error.kind
            raise

    # -- the client ----------------------------------------------------------------------

    async def fail(self, error: ProxyError) -> None:
        """Tell the client, if it is still there: an OpenAI-style error body, or, once an
        event stream has begun, its last event (any other body is cut off: the only
        honest signal left)."""
        exchange = self.exchange
        if self.down.gone:
            return
        if not self.down.started:
            exchange.status = error.status
        # Recorded before the client hears of it, as for a reply: it sees it in /metrics.
        self.record()
        with contextlib.suppress(ClientGone):
            if self.down.started:
                if self._is_event_stream():
                    await self.down.end(self.stream_error_event(error))
                return
            headers = [
                (b"content-type", JSON),
                (hdrs.OVERHEAD.encode(), exchange.overhead_ms_header),
                *error.headers,
            ]
            await self.down.respond(error.status, headers, jsonio.dumps(error.body()))

    def stream_error_event(self, error: ProxyError) -> bytes:
        """An event stream's last event when the call fails after it began."""
        return sse_error_event(error)

    def _is_event_stream(self) -> bool:
        return self.response is not None and hdrs.is_event_stream(self.response.headers)

    def log_body(self, kind: str, body: Body) -> None:
        if self.settings.log_bodies:
            body_log.info("%s %s", kind, joined(body).decode(errors="replace"))


def _being_cancelled() -> bool:
    """Whether the running task itself is being cancelled (not merely awaiting something
    that was)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
