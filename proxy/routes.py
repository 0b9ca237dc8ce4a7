"""HTTP handlers: parse, rewrite, send upstream, relay. Thin: decisions live elsewhere."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response

from proxy import headers as hdrs
from proxy import jsonio
from proxy.chunks import reply_message
from proxy.compaction import Compactor
from proxy.config import Settings
from proxy.errors import BadRequest, BodyTooLarge, ProxyError, UpstreamError
from proxy.exchange import Exchange, Recorder
from proxy.fanout import FanoutGate
from proxy.relay import ChatStreamWatcher, RelayResponse, relay_chunks
from proxy.rewrite import Pipeline, RewriteContext
from proxy.rewrite.stream_usage import request_usage
from proxy.tracker import SessionTracker, Turn
from proxy.upstream import Upstream, UpstreamResponse

CHAT_ROUTE = "/v1/chat/completions"
KNOWN_ROUTES = frozenset(
    {
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses",
        "/v1/models",
        "/tokenize",
        "/detokenize",
    }
)
REWRITE_HEADER = "x-prefill-proxy-rewrite"
# How vLLM refuses a prompt longer than its context: 0.32 names the context length
# (tests/e2e/test_compaction.py); some versions report the negative max_tokens left over.
OVERFLOW_MARKERS = (b"max_tokens must be at least 1, got -", b"maximum context length is")
JSON = "application/json"
log = logging.getLogger("prefill_proxy.routes")
# Prompt and completion text: only with the log_bodies setting (debugging).
body_log = logging.getLogger("prefill_proxy.bodies")


async def read_body(request: Request, limit: int) -> bytes:
    """The whole request body, refusing more than ``limit`` bytes before reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body of {declared} bytes is over the {limit}-byte limit")
    parts: list[bytes] = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise BodyTooLarge(f"request body is over the {limit}-byte limit")
        parts.append(part)
    return b"".join(parts)


def parse_chat_request(body: bytes) -> dict:
    try:
        payload = jsonio.loads(body)
    except jsonio.InvalidJSON as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise BadRequest("request body must be a JSON object")
    return payload


def read_reply(body: bytes) -> tuple[dict | None, dict | None]:
    """(usage, the assistant message as emitted) of a non-streamed reply."""
    try:
        payload = jsonio.loads(body)
    except jsonio.InvalidJSON:
        return None, None
    usage = payload.get("usage") if isinstance(payload, dict) else None
    return (usage if isinstance(usage, dict) else None), reply_message(payload)


class Handlers:
    """The proxy's endpoints, bound to their dependencies."""

    def __init__(
        self,
        settings: Settings,
        upstream: Upstream,
        pipeline: Pipeline,
        recorder: Recorder,
        sessions: SessionTracker | None = None,
        compactor: Compactor | None = None,
        fanout: FanoutGate | None = None,
    ) -> None:
        self.settings = settings
        self.upstream = upstream
        self.pipeline = pipeline
        self.recorder = recorder
        self.sessions = sessions
        self.compactor = compactor
        self.fanout = fanout

    async def chat_completions(self, request: Request) -> Response:
        exchange = self.recorder.begin(CHAT_ROUTE, request.method)
        try:
            body = await read_body(request, self.settings.max_body_bytes)
            payload = parse_chat_request(body)
            exchange.model = str(payload.get("model") or "")
            exchange.stream = payload.get("stream") is True
            turn = self.sessions.open(request.headers, payload) if self.sessions else None
            forwarded = self._rewrite(payload, request, exchange, turn)
            if turn is not None and self.sessions is not None:
                turn.credentials = hdrs.credentials(request.scope["headers"])
                rewritten = forwarded.get("messages")
                forwarded = await self._compact(forwarded, request, exchange, turn)
                aligned = None if forwarded.get("messages") is rewritten else rewritten
                self.sessions.forward(turn, forwarded, exchange, rewritten_messages=aligned)
            strip_usage = False
            if exchange.stream and (with_usage := request_usage(forwarded)) is not None:
                forwarded, strip_usage = with_usage, True
            content = body if forwarded is payload else jsonio.dumps(forwarded)
            if self.settings.log_bodies:
                body_log.info("request %s", content.decode(errors="replace"))
            if self.fanout is not None:
                await self.fanout.admit(forwarded, exchange)
            return await self._forward(
                request, exchange, content, chat=True, strip_usage=strip_usage, turn=turn
            )
        except ProxyError as error:
            return self._fail(exchange, error)

    async def passthrough(self, request: Request) -> Response:
        path = request.scope["path"]
        exchange = self.recorder.begin(path if path in KNOWN_ROUTES else "other", request.method)
        try:
            body = await read_body(request, self.settings.max_body_bytes)
            return await self._forward(request, exchange, body or None, chat=False)
        except ProxyError as error:
            return self._fail(exchange, error)

    async def health(self, request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type=JSON)

    async def ready(self, request: Request) -> Response:
        path = self.settings.ready_path
        try:
            status = await self.upstream.probe(path)
        except UpstreamError as error:
            return _error_response(error, 503)
        if status >= 400:
            problem = UpstreamError(
                f"upstream {self.upstream.base_url} answered {status} on {path}"
            )
            return _error_response(problem, 503)
        return Response(b'{"status":"ready"}', media_type=JSON)

    async def metrics(self, request: Request) -> Response:
        registry = self.recorder.metrics.registry
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    def _rewrite(
        self, payload: dict, request: Request, exchange: Exchange, turn: Turn | None
    ) -> dict:
        if not (self.pipeline and self.settings.rewrite):
            return payload
        if request.headers.get(REWRITE_HEADER, "").strip().lower() == "off":
            return payload
        context = RewriteContext(
            headers=request.headers,
            session=turn.session if turn is not None else None,
            volatile=self.sessions.detector if self.sessions is not None else None,
            message_keys=turn.keys if turn is not None else (),
        )
        result = self.pipeline.apply(payload, context)
        exchange.rewrites, exchange.rewrite_failures = result.applied, result.failed
        return result.request

    async def _compact(
        self, forwarded: dict, request: Request, exchange: Exchange, turn: Turn
    ) -> dict:
        if self.compactor is None or not self.settings.rewrite:
            return forwarded
        if request.headers.get(REWRITE_HEADER, "").strip().lower() == "off":
            return forwarded
        try:
            return await self.compactor.apply(forwarded, turn, exchange)
        except Exception:  # fail open: the request goes on uncompacted
            log.exception("compaction failed; forwarding the request uncompacted")
            exchange.rewrite_failures += ("compaction",)
            return forwarded

    async def _forward(
        self,
        request: Request,
        exchange: Exchange,
        content: bytes | None,
        *,
        chat: bool,
        strip_usage: bool = False,
        turn: Turn | None = None,
    ) -> Response:
        scope = request.scope
        path = scope.get("raw_path") or scope["path"].encode()
        if scope["query_string"]:
            path += b"?" + scope["query_string"]
        headers = hdrs.upstream_request(scope["headers"], parsed_body=chat)
        # Time held behind a fan-out leader is waiting by design, not the proxy's cost.
        exchange.overhead_s = time.perf_counter() - exchange.started - exchange.held_s
        try:
            upstream = await self.upstream.send(request.method, path.decode(), headers, content)
        except UpstreamError as error:
            exchange.error_kind = error.kind
            raise
        exchange.status = upstream.status
        if upstream.status >= 400:
            exchange.error_kind = f"status_{upstream.status // 100}xx"
        out_headers = hdrs.client_response(
            upstream.headers, exchange.overhead_ms_header, keep_length=not strip_usage
        )
        if exchange.compaction:
            out_headers.append((hdrs.COMPACTION, exchange.compaction.encode()))
        finish = functools.partial(self._finish, turn)
        if chat and not (exchange.stream and hdrs.is_event_stream(upstream.headers)):
            return await self._buffered(upstream, exchange, out_headers, finish)
        watcher = None
        if chat:
            on_reply = None
            if turn is not None and self.sessions is not None:
                on_reply = functools.partial(self.sessions.close, turn)
            watcher = ChatStreamWatcher(exchange, strip_usage=strip_usage, on_reply=on_reply)
        return RelayResponse(
            relay_chunks(upstream, exchange, watcher),
            status=upstream.status,
            headers=out_headers,
            upstream=upstream,
            exchange=exchange,
            on_finish=finish,
        )

    def _finish(self, turn: Turn | None, exchange: Exchange) -> None:
        if turn is not None and self.sessions is not None:
            self.sessions.close(turn, exchange)
        self.recorder.finish(exchange)

    async def _buffered(
        self,
        upstream: UpstreamResponse,
        exchange: Exchange,
        headers: list[tuple[bytes, bytes]],
        finish: Callable[[Exchange], None],
    ) -> Response:
        """A non-streamed chat reply: small, and vLLM sends it at once; read it for usage
        and the reply."""
        try:
            body = await upstream.read()
        except UpstreamError as error:
            exchange.error_kind = error.kind
            raise
        finally:
            await upstream.aclose()
        if exchange.status == 200:
            exchange.usage, exchange.reply = read_reply(body)
        elif exchange.status == 400 and any(marker in body for marker in OVERFLOW_MARKERS):
            exchange.context_overflow = True
        if self.settings.log_bodies:
            body_log.info("response %s", body.decode(errors="replace"))
        response = Response(body, status_code=exchange.status)
        response.raw_headers = hdrs.with_length(headers, len(body))
        finish(exchange)
        return response

    def _fail(self, exchange: Exchange, error: ProxyError) -> Response:
        exchange.status = error.status
        response = _error_response(error, error.status)
        response.headers[hdrs.OVERHEAD] = exchange.overhead_ms_header.decode()
        self.recorder.finish(exchange)
        return response


def _error_response(error: ProxyError, status: int) -> Response:
    return Response(jsonio.dumps(error.body()), status_code=status, media_type=JSON)
