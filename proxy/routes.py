"""HTTP endpoints: each hands its request to the call that tells its story (proxy.chat,
proxy.passthrough) or answers it itself (health, readiness, metrics); and the app's error
handlers, so that no error reaches a client as anything but OpenAI-style JSON."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from proxy import jsonio
from proxy.call import Call, Services
from proxy.downstream import ClientGone, Downstream
from proxy.errors import ProxyError, UpstreamError, error_body
from proxy.metrics import Metrics

JSON = "application/json"
JSON_BYTES = JSON.encode()
INTERNAL_ERROR = jsonio.dumps(
    error_body("the proxy failed on this request", "server_error", "internal_error")
)
log = logging.getLogger("prefill_proxy.routes")


class Endpoint:
    """An ASGI endpoint running one call per request (Starlette routes an object like
    this as a plain ASGI app: the call reads the body and writes the response itself).
    The proxied routes' endpoints are also called without Starlette's stack
    (proxy.app.ProxyApp), so they are their own last resort: what escapes a call's own
    handling (a bug in its books) is a counted, logged 500 ``internal_error``, as
    ``internal_error_handler`` answers for the other routes."""

    def __init__(self, call: Callable[[Downstream], Call], metrics: Metrics) -> None:
        self._call = call
        self._metrics = metrics

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        down = Downstream(scope, receive, send)
        try:
            await self._call(down).run()
        except Exception:
            log.exception("%s %s failed outside its call's handling", down.method, down.target)
            self._metrics.internal_errors.labels("other").inc()
            if not down.started and not down.gone:
                with contextlib.suppress(ClientGone):
                    await down.respond(500, [(b"content-type", JSON_BYTES)], INTERNAL_ERROR)


class Probes:
    """/health (the proxy itself), /ready (and its upstream), /metrics."""

    def __init__(self, services: Services) -> None:
        self._settings = services.settings
        self._upstream = services.upstream
        self._engines = services.engines
        self._registry = services.recorder.metrics.registry

    async def health(self, request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type=JSON)

    async def ready(self, request: Request) -> Response:
        engines = self._engines
        if engines is not None and engines.probed:  # several: what the probes found
            healthy = sum(engine.healthy for engine in engines.engines)
            body = jsonio.dumps(
                {
                    "status": "ready" if healthy else "no engine",
                    "engines": len(engines.engines),
                    "healthy": healthy,
                }
            )
            return Response(body, status_code=200 if healthy else 503, media_type=JSON)
        path = self._settings.ready_path
        try:
            status = await self._upstream.probe(path)
        except UpstreamError as error:
            return error_response(error, 503)
        if status >= 400:
            problem = UpstreamError(
                f"upstream {self._upstream.base_url} answered {status} on {path}"
            )
            return error_response(problem, 503)
        return Response(b'{"status":"ready"}', media_type=JSON)

    async def metrics(self, request: Request) -> Response:
        return Response(generate_latest(self._registry), media_type=CONTENT_TYPE_LATEST)


def error_response(error: ProxyError, status: int) -> Response:
    return Response(jsonio.dumps(error.body()), status_code=status, media_type=JSON)


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (a method no route takes): OpenAI-style, not ``detail``."""
    assert isinstance(exc, HTTPException)
    body = error_body(str(exc.detail), "invalid_request_error", exc.status_code)
    return Response(
        jsonio.dumps(body), status_code=exc.status_code, media_type=JSON, headers=exc.headers
    )


def internal_error_handler(
    metrics: Metrics,
) -> Callable[[Request, Exception], Coroutine[Any, Any, Response]]:
    """Starlette's last resort for an exception no endpoint handled (a bug): a counted 500
    ``internal_error`` in OpenAI's shape. Starlette then re-raises it to the server, which
    logs it once with its traceback (the calls catch and log their own)."""

    async def handle(request: Request, exc: Exception) -> Response:
        metrics.internal_errors.labels("other").inc()
        return Response(INTERNAL_ERROR, status_code=500, media_type=JSON)

    return handle
