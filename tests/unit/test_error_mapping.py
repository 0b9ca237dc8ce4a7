"""httpx and engine-pool failures become the proxy's errors, with the status a client
expects."""

from __future__ import annotations

import httpx
import pytest

from proxy import config, errors, http1
from proxy.upstream import Upstream

UPSTREAM = Upstream(config.load({"upstream": "http://engine:8000"}, environ={}))


def wrapped(outer: type[httpx.HTTPError], cause: BaseException) -> httpx.HTTPError:
    """An httpx error caused by another (a transport wrapping another client's)."""
    exc = outer("x")
    exc.__cause__ = cause
    return exc


REFUSED = http1.ConnectError("engine:8000: [Errno 111] Connection refused")


@pytest.mark.parametrize(
    ("exc", "expected", "status"),
    [
        (httpx.ConnectError("refused"), errors.UpstreamError, 502),
        (httpx.ConnectTimeout("slow"), errors.UpstreamTimeout, 504),
        (httpx.ReadTimeout("slow"), errors.UpstreamTimeout, 504),
        (httpx.RemoteProtocolError("cut"), errors.UpstreamProtocolError, 502),
        (TimeoutError(), errors.UpstreamTimeout, 504),
        # The engines' pool's own (proxy.http1).
        (REFUSED, errors.UpstreamError, 502),
        (http1.ProtocolError("connection closed mid-response"), errors.UpstreamProtocolError, 502),
        (http1.ReadTimeout("no bytes"), errors.UpstreamTimeout, 504),
        (http1.HeadTimeout("no head by the deadline"), errors.UpstreamTimeout, 504),
        (ConnectionResetError(104, "reset"), errors.UpstreamProtocolError, 502),
        # A transport that maps any connection error to ConnectTimeout: the cause counts.
        (wrapped(httpx.ConnectTimeout, REFUSED), errors.UpstreamError, 502),
        (
            wrapped(httpx.ConnectTimeout, http1.ProtocolError("cut")),
            errors.UpstreamProtocolError,
            502,
        ),
        (wrapped(httpx.ReadTimeout, http1.ReadTimeout("slow")), errors.UpstreamTimeout, 504),
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
