"""httpx/aiohttp failures become the proxy's errors, with the status a client expects."""

from __future__ import annotations

import aiohttp
import httpx
import pytest

from proxy import config, errors
from proxy.upstream import Upstream

UPSTREAM = Upstream(config.load({"upstream": "http://engine:8000"}, environ={}))


def wrapped(outer: type[httpx.HTTPError], cause: BaseException) -> httpx.HTTPError:
    """An httpx error caused by another (an httpx transport wrapping aiohttp's)."""
    exc = outer("x")
    exc.__cause__ = cause
    return exc


class _Key:
    host, port, ssl = "engine", 8000, False


REFUSED = aiohttp.ClientConnectorError(_Key(), ConnectionRefusedError(111, "refused"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("exc", "expected", "status"),
    [
        (httpx.ConnectError("refused"), errors.UpstreamError, 502),
        (httpx.ConnectTimeout("slow"), errors.UpstreamTimeout, 504),
        (httpx.ReadTimeout("slow"), errors.UpstreamTimeout, 504),
        (httpx.RemoteProtocolError("cut"), errors.UpstreamProtocolError, 502),
        (TimeoutError(), errors.UpstreamTimeout, 504),
        # aiohttp's own, as the engines' pool raises them.
        (REFUSED, errors.UpstreamError, 502),
        (aiohttp.ServerDisconnectedError(), errors.UpstreamProtocolError, 502),
        (aiohttp.SocketTimeoutError(), errors.UpstreamTimeout, 504),
        (aiohttp.ClientPayloadError("truncated"), errors.UpstreamProtocolError, 502),
        # httpx-aiohttp mapped any ClientConnectionError to ConnectTimeout: the cause counts.
        (wrapped(httpx.ConnectTimeout, REFUSED), errors.UpstreamError, 502),
        (
            wrapped(httpx.ConnectTimeout, aiohttp.ServerDisconnectedError()),
            errors.UpstreamProtocolError,
            502,
        ),
        (wrapped(httpx.ReadTimeout, aiohttp.SocketTimeoutError()), errors.UpstreamTimeout, 504),
        (
            wrapped(httpx.ReadError, aiohttp.ClientPayloadError("truncated")),
            errors.UpstreamProtocolError,
            502,
        ),
    ],
)
def test_translation(exc: BaseException, expected: type, status: int) -> None:
    error = UPSTREAM._translate(exc)
    assert type(error) is expected
    assert error.status == status
    assert "http://engine:8000" in error.message
    assert set(error.body()["error"]) == {"message", "type", "param", "code"}


def test_error_kinds_label_the_metric() -> None:
    kinds = {
        errors.UpstreamError.kind,
        errors.UpstreamTimeout.kind,
        errors.UpstreamProtocolError.kind,
    }
    assert kinds == {"connect", "timeout", "read"}


def test_sse_error_event_is_an_openai_error_then_done() -> None:
    event = errors.sse_error_event(errors.UpstreamProtocolError("gone"))
    assert event.startswith(b'data: {"error":{"message":"gone"')
    assert event.endswith(b"\n\ndata: [DONE]\n\n")
