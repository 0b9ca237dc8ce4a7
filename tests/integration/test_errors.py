"""Every error reaches the client as OpenAI-style JSON: a bug (an exception nothing expected)
as a counted 500 internal_error, Starlette's own refusals too; never an HTML or text page."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry

from proxy import config
from proxy.app import create_app
from proxy.exchange import Recorder
from tests.support.servers import serve

CHAT = "/v1/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def broken(request: httpx.Request) -> httpx.Response:
    raise RuntimeError("a bug below the proxy's error mapping")


def assert_openai_error(response: httpx.Response, status: int, code: object) -> None:
    assert response.status_code == status
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code


@pytest.mark.anyio
@pytest.mark.parametrize("path", [CHAT, "/v1/embeddings"])
async def test_a_bug_in_a_call_is_a_counted_500_internal_error(make_proxy, path: str) -> None:
    proxy = make_proxy(broken)
    response = await proxy.client.post(path, json=BODY)
    assert_openai_error(response, 500, "internal_error")
    route = path if path == CHAT else "/v1/embeddings"
    assert proxy.sample("prefill_proxy_internal_errors_total", route=route) == 1
    assert proxy.sample("prefill_proxy_in_flight_requests") == 0
    assert (
        proxy.sample(
            "prefill_proxy_requests_total",
            route=route,
            model="m" if path == CHAT else "unknown",
            status="500",
        )
        == 1
    )


def test_a_bug_outside_the_calls_is_caught_by_the_app() -> None:
    """Under a real server: Starlette answers with the handler's 500, then hands the
    exception to uvicorn, which logs its traceback."""
    registry = CollectorRegistry()
    settings = config.load({"upstream": "http://engine:8000"}, environ={})
    app = create_app(settings, transport=httpx.MockTransport(broken), registry=registry)
    with serve(app) as url:
        response = httpx.get(url + "/ready", timeout=10)  # the probe raises what no code expects
    assert_openai_error(response, 500, "internal_error")
    assert registry.get_sample_value("prefill_proxy_internal_errors_total", {"route": "other"}) == 1


@pytest.mark.parametrize("path", [CHAT, "/v1/embeddings"])
def test_a_bug_outside_a_calls_handling_is_a_counted_500_on_every_route(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    """The chat routes skip Starlette's stack (proxy.app.ProxyApp); their endpoint is its
    own last resort, as the app is for the others: OpenAI-style, counted once, logged."""

    def fails(*args: object) -> None:
        raise RuntimeError("a bug before the call could handle anything")

    monkeypatch.setattr(Recorder, "begin", fails)
    registry = CollectorRegistry()
    settings = config.load({"upstream": "http://engine:8000"}, environ={})
    app = create_app(settings, transport=httpx.MockTransport(broken), registry=registry)
    with serve(app) as url:
        response = httpx.post(url + path, json=BODY, timeout=10)
    assert_openai_error(response, 500, "internal_error")
    assert registry.get_sample_value("prefill_proxy_internal_errors_total", {"route": "other"}) == 1
    assert "a bug before the call could handle anything" in caplog.text


@pytest.mark.anyio
async def test_a_method_no_route_takes_is_refused_in_openai_shape(make_proxy) -> None:
    proxy = make_proxy()
    response = await proxy.client.request("TRACE", CHAT)
    assert_openai_error(response, 405, 405)
    assert proxy.seen == []


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("depth", "status"), [(100_000, 400), (5_000, 400), (1_000, 200), (300, 200)]
)
@pytest.mark.parametrize("upstream", ["http://engine:8000", "http://e1:8000,http://e2:8000"])
async def test_deep_bodies_are_refused_past_the_limit_and_pass_through_under_it(
    make_proxy, depth: int, status: int, upstream: str
) -> None:
    """Past orjson's 1,024 levels: a 400 naming the problem. Under it: forwarded (what the
    proxy cannot rewrite goes as sent: fail open), never a 500; also where the request's
    prefix family places it among several engines."""
    proxy = make_proxy(upstream=upstream)
    nested = "[" * depth + "]" * depth
    body = (
        '{"model": "m", "messages": [{"role": "user", "content": "hi"}], '
        f'"tools": [{{"type": "function", "function": {{"name": "f", "parameters": {nested}}}}}]}}'
    )
    response = await proxy.client.post(CHAT, content=body)
    assert response.status_code == status
    if status == 400:
        assert "deeper than 1024 levels" in response.json()["error"]["message"]
        assert proxy.seen == []
    assert proxy.sample("prefill_proxy_in_flight_requests") == 0


@pytest.mark.anyio
async def test_a_cancelled_task_awaited_for_the_request_is_an_error_not_a_cancellation(
    make_proxy,
) -> None:
    """Awaiting something another task cancelled (a shared summary, say) raises
    CancelledError in a request that nobody cancelled: answered like any bug."""
    import asyncio

    def cancelled(request: httpx.Request) -> httpx.Response:
        raise asyncio.CancelledError

    proxy = make_proxy(cancelled)
    response = await proxy.client.post(CHAT, json=BODY)
    assert_openai_error(response, 500, "internal_error")
    assert proxy.sample("prefill_proxy_in_flight_requests") == 0
