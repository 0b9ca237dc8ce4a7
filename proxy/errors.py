"""The proxy's exception tree and its OpenAI-style error bodies."""

from __future__ import annotations

from typing import Any

from proxy import jsonio


class ProxyError(Exception):
    """An error the proxy answers itself, rendered as ``{"error": {...}}``."""

    status = 500
    type = "proxy_error"
    code = "internal_error"
    headers: tuple[tuple[bytes, bytes], ...] = ()  # sent with the error response

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.code)


class BadRequest(ProxyError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_json"


class Unauthorized(ProxyError):
    """No key, or not one of ``api_keys``."""

    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"
    headers = ((b"www-authenticate", b"Bearer"),)  # RFC 9110 section 11.6.1


class NotForwarded(ProxyError):
    """A path the proxy does not forward (proxy.paths)."""

    status = 404
    type = "invalid_request_error"
    code = "not_found"


class BodyTooLarge(ProxyError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class InternalError(ProxyError):
    """A bug in the proxy: logged with its traceback and counted where it is caught."""

    type = "server_error"


class ShuttingDown(ProxyError):
    """The proxy is stopping and this request outlasted the shutdown grace period."""

    status = 503
    type = "server_error"
    code = "shutting_down"


class UpstreamError(ProxyError):
    """The upstream could not be used; ``kind`` labels the error metric."""

    status = 502
    type = "upstream_error"
    code = "upstream_unavailable"
    kind = "connect"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"
    kind = "timeout"


class UpstreamProtocolError(UpstreamError):
    """The upstream broke the exchange after it started (reset, truncated stream)."""

    code = "upstream_broken"
    kind = "read"


def error_body(message: str, type_: str, code: str | int) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def sse_error_event(error: ProxyError) -> bytes:
    """A stream's last words when the upstream fails mid-stream (vLLM's own shape)."""
    return b"data: " + jsonio.dumps(error.body()) + b"\n\ndata: [DONE]\n\n"
