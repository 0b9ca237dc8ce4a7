"""The chat-completions story, one request at a time, in the order it happens:

    parse -> session -> rewrite -> compaction -> forward -> relay -> record

``ChatCall.handle`` tells it; the lifecycle around it (the client leaving at any point,
errors, recording exactly once) is ``proxy.call.Call``'s. Decisions live in the pieces it
calls: the rewrite pipeline (pure), the session tracker, the compactor, the fan-out gate.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from proxy import headers as hdrs
from proxy import jsonio, splice
from proxy.bodies import BodyCache, Kept, Parsed, Span
from proxy.call import Call, Services
from proxy.chunks import reply_message
from proxy.compaction import Compactor
from proxy.downstream import Downstream
from proxy.engines import Engine
from proxy.errors import BadRequest
from proxy.failopen import FailOpenLog
from proxy.fanout import FanoutGate
from proxy.known import Known
from proxy.pieces import Body, Lead
from proxy.relay import ChatStreamWatcher, StreamWatcher
from proxy.rewrite import Pipeline, RewriteContext
from proxy.rewrite.stream_usage import request_usage
from proxy.sessions import fingerprint
from proxy.tracker import SessionTracker
from proxy.turn import Turn
from proxy.upstream import UpstreamResponse

CHAT_ROUTE = "/v1/chat/completions"
REWRITE_HEADER = "x-prefill-proxy-rewrite"
# How vLLM refuses a prompt longer than its context: 0.32 names the context length
# (tests/e2e/test_compaction.py), on /v1/responses the max_model_len
# (vllm/entrypoints/openai/responses/serving.py); some versions report the negative
# max_tokens left over.
OVERFLOW_MARKERS = (
    b"max_tokens must be at least 1, got -",
    b"maximum context length is",
    b"exceeds the max_model_len",
)
log = logging.getLogger("prefill_proxy.chat")


@dataclasses.dataclass(frozen=True)
class ChatServices(Services):
    pipeline: Pipeline = dataclasses.field(default_factory=lambda: Pipeline(()))
    sessions: SessionTracker | None = None
    compactor: Compactor | None = None
    fanout: FanoutGate | None = None
    # Recent bodies, for parsing only what is new: chat's (messages), Responses' (input).
    bodies: BodyCache | None = None
    response_bodies: BodyCache | None = None
    failures: FailOpenLog = dataclasses.field(default_factory=lambda: FailOpenLog(log))


def _unmasked(text: str) -> str:
    return text


def _object(parse: Callable[[], Parsed]) -> Parsed:
    """``parse()``, a JSON object, or the client's 400."""
    try:
        parsed = parse()
    except jsonio.InvalidJSON as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(parsed.payload, dict):
        raise BadRequest("request body must be a JSON object")
    return parsed


# How vLLM's request models read ``stream`` (pydantic, lax mode): these mean true.
_TRUE = frozenset({"true", "1", "yes", "on", "t", "y"})


def streams(value: Any) -> bool:
    """Whether the engine will stream: ``true`` and what pydantic reads as true (1, "true",
    "yes", ...). Anything else is non-stream, or the engine's own 400."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value == 1
    return isinstance(value, str) and value.strip().lower() in _TRUE


def read_reply(body: bytes) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(usage, the assistant message as emitted) of a non-streamed reply."""
    try:
        payload = jsonio.loads(body)
    except jsonio.InvalidJSON:
        return None, None
    usage = payload.get("usage") if isinstance(payload, dict) else None
    return (usage if isinstance(usage, dict) else None), reply_message(payload)


class ChatCall(Call):
    route = CHAT_ROUTE

    def __init__(self, services: ChatServices, down: Downstream) -> None:
        super().__init__(services, down)
        self.chat = services
        self.turn: Turn | None = None
        self.payload: dict[str, Any] = {}
        self.strip_usage = False  # the proxy asked for stream usage the client did not
        self.spans: list[Span] | None = None  # where each client message is in the body
        self.known: Known | None = None  # what is known of them (proxy.transcript.Memo)
        self.kept: Kept | None = None  # the body as the body cache keeps it
        self.body = b""  # as the client sent it
        self.content: Body | None = None  # as it went to the engine
        self._credentials: tuple[tuple[bytes, bytes], ...] | None = None
        # The client's switch for this request: X-Prefill-Proxy-Rewrite: off.
        switch = down.headers.get(REWRITE_HEADER, "").strip().lower()
        self.rewriting = bool(self.chat.pipeline) and self.settings.rewrite and switch != "off"

    async def handle(self) -> None:
        exchange = self.exchange
        body = self.body = await self.down.read_body(self.settings.max_body_bytes)
        self.head_start(body)
        payload = self.payload = self.read_request(body)
        exchange.model = str(payload.get("model") or "")
        exchange.stream = streams(payload.get("stream"))
        self.turn = await self.open_session(payload)
        if self.turn is not None:
            self.turn.body_bytes = len(body)
        forwarded = self.rewrite(payload)
        forwarded = await self.compact(forwarded)
        forwarded = self.ask_for_usage(forwarded)
        content = self.content = body if forwarded is payload else self.encode(forwarded, body)
        self.log_body("request", content)
        if self.chat.fanout is not None:
            self.judge()  # a hold is for requests that do not continue their session
            await self.chat.fanout.admit(forwarded, exchange)
        response = await self.send(content, parsed_body=True)
        self.remember_router_token(response)
        if exchange.stream and hdrs.is_event_stream(response.headers):
            exchange.observe_gap = self.services.recorder.gap_observer(exchange)
            watcher = self.watcher()
            await self.relay(self.reply_headers(keep_length=not self.strip_usage), watcher)
            if watcher.reply_too_long:
                self.services.recorder.metrics.replies_too_long.inc()
        else:
            await self.reply_whole()

    # -- the steps -----------------------------------------------------------------------

    def body_cache(self) -> BodyCache | None:
        """Where this route's recent bodies are kept."""
        return self.chat.bodies

    def head_start(self, body: bytes) -> None:
        """A big body that continues a kept one starts going to the engine now, while the
        proxy works on it: what the conversation's last request forwarded up to the end of
        its messages, to that request's engine (early_upload_bytes). With the router's
        headers it waits: those come from the session, not yet looked up."""
        settings, bodies = self.settings, self.body_cache()
        minimum = settings.early_upload_bytes
        if not minimum or len(body) < minimum or bodies is None:
            return
        if settings.upstream_session_header or settings.upstream_affinity_header:
            return
        try:
            lead = bodies.lead(body, self.credential())
            if lead is not None:
                self.begin_early(body, *lead)
        except Exception as exc:  # fail open: the request goes whole, as without
            self.chat.failures.failed("early upload", exc)

    def credentials(self) -> tuple[tuple[bytes, bytes], ...]:
        """The client's credential headers (looked for once: three steps ask)."""
        if self._credentials is None:
            self._credentials = hdrs.credentials(self.down.raw_headers)
        return self._credentials

    def credential(self) -> bytes:
        """The client's credentials, which a kept body is only ever continued under."""
        return b"\n".join(value for _, value in self.credentials())

    def read_request(self, body: bytes) -> dict[str, Any]:
        """The request as the conversation the pipeline reads (a chat request, here)."""
        parsed = self.parse_body(body, self.body_cache())
        self.spans, self.known, self.kept = parsed.spans, parsed.known, parsed.kept
        payload: dict[str, Any] = parsed.payload
        return payload

    def parse_body(self, body: bytes, bodies: BodyCache | None) -> Parsed:
        """The body as a JSON object (else the client's 400): the continuation of a body
        ``bodies`` kept from an earlier step, where it is one (proxy.bodies)."""
        if bodies is None:
            return _object(lambda: Parsed(jsonio.loads(body)))
        credential = self.credential()
        try:
            parsed = _object(lambda: bodies.parse(body, credential))
        except BadRequest:
            raise
        except Exception as exc:  # fail open: parsed whole, as without the cache
            self.chat.failures.failed("body cache", exc)
            self.exchange.rewrite_failures += ("body_cache",)
            return _object(lambda: Parsed(jsonio.loads(body)))
        metrics = self.services.recorder.metrics
        if parsed.reused:
            metrics.body_parses.labels("continued").inc()
            metrics.body_bytes_reused.inc(parsed.reused_bytes)
        else:
            metrics.body_parses.labels("whole").inc()
        return parsed

    def read_reply(self, body: bytes) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """(usage, the reply as a chat message) of a whole, successful reply."""
        return read_reply(body)

    async def open_session(self, payload: dict[str, Any]) -> Turn | None:
        sessions = self.chat.sessions
        if sessions is None:
            return None
        turn = await sessions.open(self.down.headers, payload, known=self.known)
        self.credit(turn)
        return turn

    def credit(self, turn: Turn | None) -> None:
        """The credentials for the proxy's own requests on this client's behalf."""
        if turn is not None:
            turn.credentials = hdrs.upstream_credentials(
                self.settings.upstream_api_key
            ) or self.credentials()

    def routing_headers(self) -> list[tuple[bytes, bytes]]:
        """The session for a router in front of the engines: its key, and the affinity
        token the router gave it last time."""
        if self.turn is None:
            return []
        session, extra = self.turn.session, []
        if name := self.settings.upstream_session_header:
            extra.append((name.lower().encode("latin-1"), hdrs.header_value(session.key)))
        if (name := self.settings.upstream_affinity_header) and session.router_token:
            extra.append((name.lower().encode("latin-1"), session.router_token.encode("latin-1")))
        return extra

    def remember_router_token(self, response: UpstreamResponse) -> None:
        """The router's affinity token, kept with the session (saved with the reply)."""
        name = self.settings.upstream_affinity_header.lower().encode("latin-1")
        if not name or self.turn is None:
            return
        for header, value in response.headers:
            if header.lower() == name:
                self.turn.session.router_token = value.decode("latin-1")

    def choose_engine(self) -> Engine:
        """The session's engine (placed, kept or moved: saved with its record). Without a
        record (sessions off, the store down) the request still goes where its prefix
        family is placed, which is where its session most likely lives."""
        engines = self.services.engines
        assert engines is not None
        turn = self.turn
        if not engines.probed:  # one engine: nothing to choose
            engine = engines.engines[0]
        elif turn is None:
            family = self.prefix_family()
            if family:
                engine = engines.for_session(family, "", recorded=False).engine
            else:
                engine = engines.for_request()
        else:
            by_prefix = self.settings.engine_placement == "prefix"
            ranked_by = (self.prefix_family() if by_prefix else "") or turn.session.key
            engine = engines.for_session(ranked_by, turn.session.engine).engine
        if turn is not None:
            turn.session.engine = engine.url
        return engine

    def prefix_family(self) -> str:
        """The request's system prompt and tools as a key: conversations that share them
        share KV blocks (volatile values masked, as for the session key); '' for tools too
        odd to encode."""
        mask = self.chat.sessions.detector.key if self.chat.sessions else _unmasked
        try:
            return fingerprint(self.payload, mask, with_user=False)
        except jsonio.InvalidJSON as exc:  # fail open: placed without it
            self.chat.failures.failed("prefix family", exc)
            return ""

    def rewrite(self, payload: dict[str, Any]) -> dict[str, Any]:
        if not self.rewriting:
            return payload
        turn, sessions = self.turn, self.chat.sessions
        context = RewriteContext(
            headers=self.down.headers,
            session=turn.session if turn is not None else None,
            volatile=sessions.detector if sessions is not None else None,
            message_keys=turn.lookup_keys if turn is not None else (),
            known=self.known,
        )
        result = self.chat.pipeline.apply(payload, context)
        self.exchange.rewrites, self.exchange.rewrite_failures = result.applied, result.failed
        return result.request

    async def compact(self, forwarded: dict[str, Any]) -> dict[str, Any]:
        """Compaction, then the session learns what goes upstream."""
        turn, sessions, compactor = self.turn, self.chat.sessions, self.chat.compactor
        if turn is None or sessions is None:
            return forwarded
        rewritten = forwarded.get("messages")
        # A request whose history the engine holds (previous_response_id) has none to fold.
        if compactor is not None and self.rewriting and turn.full_history:
            try:
                forwarded = await compactor.apply(forwarded, turn, self.exchange)
            except Exception as exc:  # fail open: the request goes on uncompacted
                self.chat.failures.failed("compaction", exc)
                self.exchange.rewrite_failures += ("compaction",)
        aligned = None if forwarded.get("messages") is rewritten else rewritten
        sessions.forward(turn, forwarded, self.exchange, rewritten_messages=aligned, judge=False)
        return forwarded

    def ask_for_usage(self, forwarded: dict[str, Any]) -> dict[str, Any]:
        """Streams always report usage upstream; the client gets what it asked for."""
        if self.exchange.stream and (with_usage := request_usage(forwarded)) is not None:
            self.strip_usage = True
            return with_usage
        return forwarded

    def encode(self, forwarded: dict[str, Any], body: bytes) -> Body:
        """The request as it goes upstream; the messages it passed on untouched as the
        client's bytes of them, not copied (proxy.splice)."""
        try:
            payload = self.payload
            messages = payload.get("messages")
            turn = self.turn
            # What the session works out of the same list for its own uses, if it has it.
            at = turn.replaced_in if turn and turn.client_messages is messages else None
            kept = self.kept  # what the next step finds of this one, if the body is kept
            known = self.known if kept is not None else None
            content = splice.encode_pieces(
                forwarded, messages, body, self.spans, payload, at, known
            )
            if kept is not None and (cache := self.body_cache()) is not None:
                cache.recount(kept)  # what the splice kept with it (proxy.encoded)
            return content
        except jsonio.InvalidJSON as exc:  # fail open: the client's own bytes go instead
            log.warning("cannot encode the rewritten request (%s); forwarding it as sent", exc)
            self.exchange.rewrite_failures += ("encode",)
            return body

    def reply_after_end(self) -> bool:
        # A store that waits (a shared one) saves first: another replica may take the
        # client's next request.
        sessions = self.chat.sessions
        return sessions is not None and not sessions.store.waits

    def watcher(self) -> StreamWatcher:
        return ChatStreamWatcher(
            self.exchange,
            strip_usage=self.strip_usage,
            # At [DONE], before the client can act on it: its next request must find it.
            on_reply=self.record_reply if self.turn is not None else None,
            max_event=self.settings.max_sse_event_bytes,
            max_reply_chars=self.settings.max_reply_chars,
        )

    async def reply_whole(self) -> None:
        """A non-streamed reply: small, and vLLM sends it at once. Answered, then read for
        usage and the reply and recorded; recorded first where the store waits."""
        body = await self.read()
        headers = self.reply_headers(keep_length=False)
        if self.chat.sessions is not None and self.chat.sessions.store.waits:
            # A shared store: saved first, since another replica may take the next request.
            await self.record_whole(body)
            await self.down.respond(self.exchange.status, headers, body)
            return
        # Nothing yields between the reply's last byte and its record (this store never
        # waits), so the client's next request still finds it, and the client does not
        # wait for the bookkeeping.
        try:
            await self.down.respond(self.exchange.status, headers, body)
        finally:
            await self.record_whole(body)

    async def record_whole(self, body: bytes) -> None:
        exchange = self.exchange
        if exchange.status == 200:
            exchange.usage, exchange.reply = self.read_reply(body)
        elif exchange.status == 400 and any(marker in body for marker in OVERFLOW_MARKERS):
            exchange.context_overflow = True
        self.log_body("response", body)
        await self.record_reply()
        self.record()

    def reply_headers(self, *, keep_length: bool) -> list[tuple[bytes, bytes]]:
        headers = self.response_headers(keep_length=keep_length)
        if self.exchange.compaction:
            headers.append((hdrs.COMPACTION, self.exchange.compaction.encode()))
        return headers

    # -- record --------------------------------------------------------------------------

    def while_engine_reads(self) -> None:
        if self.turn is not None and self.chat.sessions is not None:
            self.judge()
            self.chat.sessions.prepare(self.turn)
        self.note_lead()

    def judge(self) -> None:
        """How the request continues its session (SessionTracker.judge): while the engine
        reads it, or before its record where that did not run."""
        if self.turn is not None and self.chat.sessions is not None:
            self.chat.sessions.judge(self.turn, self.exchange)

    def record(self) -> None:
        self.judge()
        super().record()

    def note_lead(self) -> None:
        """The body's kept copy learns what its request forwarded up to the end of its
        messages, and to which engine: the conversation's next body can start going there
        early. Not after a compaction (the next one may fold other turns) or an early start
        that was discarded (the next would likely be too), nor where nothing starts early."""
        kept, content = self.kept, self.content
        if not self.settings.early_upload_bytes:
            return
        if kept is None or content is None or self.sent_to is None:
            return
        if self.exchange.compaction or self.early_discarded:
            return
        try:
            lead = Lead.of(content, self.body, len(kept.prefix))
        except Exception as exc:  # fail open: the next step goes as usual
            self.chat.failures.failed("early upload lead", exc)
            return
        if lead is not None:
            kept.lead = (lead, self.sent_to)

    async def record_reply(self) -> None:
        """The reply into its session (once; only a complete, successful one)."""
        if self.turn is not None and self.chat.sessions is not None:
            self.judge()  # against the session's last request, not this one once recorded
            await self.chat.sessions.close(self.turn, self.exchange)
