"""What the proxy sends upstream and answers, over in-process transports."""

from __future__ import annotations

import json

import httpx
import pytest

from proxy.rewrite import RewriteContext
from proxy.rewrite.pipeline import transform
from tests.support.fake_upstream import USAGE

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"
BODY = b'{ "model": "m",  "messages": [{"role": "user", "content": "hi"}], "x_unknown": [1] }'


@transform("mark")
def mark(request: dict, context: RewriteContext) -> dict:
    return {**request, "marked": True}


@transform("explode")
def explode(request: dict, context: RewriteContext) -> dict:
    raise KeyError("bug in a transform")


async def test_unchanged_request_is_forwarded_byte_for_byte(make_proxy) -> None:
    proxy = make_proxy()
    response = await proxy.client.post(CHAT, content=BODY, headers={"authorization": "Bearer k"})
    assert response.status_code == 200
    assert proxy.seen[0].content == BODY
    assert proxy.seen[0].url == "http://engine:8000/v1/chat/completions"
    assert proxy.seen[0].headers["authorization"] == "Bearer k"
    assert float(response.headers["x-prefill-proxy-overhead-ms"]) >= 0


async def test_stream_without_usage_gets_usage_requested(make_proxy) -> None:
    proxy = make_proxy()
    await proxy.client.post(CHAT, json={"model": "m", "messages": [], "stream": True})
    assert proxy.upstream_json()["stream_options"] == {"include_usage": True}


async def test_stream_that_asked_for_usage_is_forwarded_byte_for_byte(make_proxy) -> None:
    body = b'{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":true}}'
    proxy = make_proxy()
    await proxy.client.post(CHAT, content=body)
    assert proxy.seen[0].content == body


async def test_transforms_apply_and_are_counted(make_proxy) -> None:
    proxy = make_proxy(transforms=[mark])
    await proxy.client.post(CHAT, content=BODY)
    assert proxy.upstream_json()["marked"] is True
    assert proxy.sample("prefill_proxy_rewrites_applied_total", transform="mark") == 1


async def test_header_switches_rewrites_off_for_one_request(make_proxy) -> None:
    proxy = make_proxy(transforms=[mark])
    await proxy.client.post(CHAT, content=BODY, headers={"X-Prefill-Proxy-Rewrite": "off"})
    assert proxy.seen[0].content == BODY


async def test_settings_switch_rewrites_off(make_proxy) -> None:
    for overrides in ({"rewrite": False}, {"disabled_rewrites": "mark"}):
        proxy = make_proxy(transforms=[mark], **overrides)
        await proxy.client.post(CHAT, content=BODY)
        assert proxy.seen[0].content == BODY, overrides


async def test_raising_transform_fails_open(make_proxy) -> None:
    proxy = make_proxy(transforms=[mark, explode])
    response = await proxy.client.post(CHAT, content=BODY)
    assert response.status_code == 200
    assert proxy.seen[0].content == BODY
    assert proxy.sample("prefill_proxy_rewrite_failures_total", transform="explode") == 1


@pytest.mark.parametrize(
    ("body", "message"),
    [(b"{not json", "not valid JSON"), (b"[1, 2]", "JSON object"), (b"", "not valid JSON")],
)
async def test_malformed_body_is_400_openai_style(make_proxy, body: bytes, message: str) -> None:
    proxy = make_proxy()
    response = await proxy.client.post(CHAT, content=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert message in error["message"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_json"
    assert proxy.seen == []
    assert (
        proxy.sample("prefill_proxy_requests_total", route=CHAT, model="unknown", status="400") == 1
    )


async def test_body_over_the_limit_is_413(make_proxy) -> None:
    proxy = make_proxy(max_body_bytes=100)
    response = await proxy.client.post(CHAT, content=b"x" * 101)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"

    async def chunks():  # no content-length: the limit holds while reading
        for _ in range(5):
            yield b"x" * 30

    response = await proxy.client.post("/v1/embeddings", content=chunks())
    assert response.status_code == 413
    assert proxy.seen == []


@pytest.mark.parametrize("status", [400, 404, 429, 500, 503])
async def test_upstream_errors_pass_through_with_their_body(make_proxy, status: int) -> None:
    body = json.dumps({"error": {"message": "engine says no", "type": "x", "code": status}})

    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body, headers={"content-type": "application/json"})

    proxy = make_proxy(refuse)
    for path in (CHAT, "/v1/completions"):
        response = await proxy.client.post(path, json={"model": "m", "messages": []})
        assert response.status_code == status
        assert response.text == body
    kind = f"status_{status // 100}xx"
    assert proxy.sample("prefill_proxy_upstream_errors_total", kind=kind) == 2


async def test_passthrough_keeps_method_path_query_headers_body(make_proxy) -> None:
    def echo(request: httpx.Request) -> httpx.Response:
        return httpx.Response(207, content=b"raw bytes", headers={"x-upstream": "yes"})

    proxy = make_proxy(echo, passthrough_paths=("/some/*",))
    response = await proxy.client.request(
        "PUT", "/some/path%20x?a=1&b=%2F", content=b"\x00\x01", headers={"x-client": "c"}
    )
    assert (response.status_code, response.content) == (207, b"raw bytes")
    assert response.headers["x-upstream"] == "yes"
    assert "x-prefill-proxy-overhead-ms" in response.headers
    sent = proxy.seen[0]
    assert sent.method == "PUT"
    assert sent.url.raw_path == b"/some/path%20x?a=1&b=%2F"
    assert sent.content == b"\x00\x01"
    assert sent.headers["x-client"] == "c"
    assert (
        proxy.sample("prefill_proxy_requests_total", route="other", model="unknown", status="207")
        == 1
    )


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("/reset_prefix_cache", ()),  # vLLM's development endpoints
        ("/v1/%2e%2e/metrics", ("*",)),  # decoded: /v1/../metrics, the engine's /metrics
        ("/anything", ("/v1/*",)),
    ],
)
async def test_paths_off_the_allow_list_are_404_and_never_sent(
    make_proxy, path: str, allowed: tuple[str, ...]
) -> None:
    proxy = make_proxy(passthrough_paths=allowed)
    response = await proxy.client.post(path, content=b"{}")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert proxy.seen == []
    assert (
        proxy.sample("prefill_proxy_requests_total", route="other", model="unknown", status="404")
        == 1
    )


async def test_passthrough_paths_lets_more_through(make_proxy) -> None:
    proxy = make_proxy(
        lambda r: httpx.Response(200, json={}),
        passthrough_paths=("/pooling/*", "/reset_prefix_cache"),
    )
    assert (await proxy.client.post("/reset_prefix_cache")).status_code == 200
    assert (await proxy.client.post("/pooling/x")).status_code == 200
    assert (await proxy.client.post("/poolingx")).status_code == 404
    assert [r.url.path for r in proxy.seen] == ["/reset_prefix_cache", "/pooling/x"]


async def test_known_routes_pass_through(make_proxy) -> None:
    proxy = make_proxy(lambda request: httpx.Response(200, json={"ok": request.url.path}))
    for method, path in [
        ("POST", "/v1/completions"),
        ("POST", "/v1/embeddings"),
        ("POST", "/v1/responses"),
        ("POST", "/tokenize"),
        ("POST", "/detokenize"),
        ("GET", "/v1/models"),
    ]:
        response = await proxy.client.request(method, path, json={} if method == "POST" else None)
        assert response.json() == {"ok": path}
        assert (
            proxy.sample("prefill_proxy_requests_total", route=path, model="unknown", status="200")
            == 1
        )


async def test_usage_of_a_non_stream_reply_feeds_the_token_counters(make_proxy) -> None:
    proxy = make_proxy()
    for _ in range(2):
        await proxy.client.post(CHAT, content=BODY)
    labels = {"route": CHAT, "model": "m"}
    assert proxy.sample("prefill_proxy_prompt_tokens_total", **labels) == 2 * USAGE["prompt_tokens"]
    cached = USAGE["prompt_tokens_details"]["cached_tokens"]
    assert proxy.sample("prefill_proxy_cached_prompt_tokens_total", **labels) == 2 * cached
    assert proxy.sample("prefill_proxy_computed_prompt_tokens_total", **labels) == 2 * (
        USAGE["prompt_tokens"] - cached
    )
    assert proxy.sample("prefill_proxy_completion_tokens_total", **labels) == 6
    assert proxy.sample("prefill_proxy_in_flight_requests") == 0


async def test_model_label_is_bounded(make_proxy) -> None:
    proxy = make_proxy(model_label_limit=2)
    for model in ("a", "b", "c", "d"):
        await proxy.client.post(CHAT, json={"model": model, "messages": []})
    count = lambda model: proxy.sample(  # noqa: E731
        "prefill_proxy_requests_total", route=CHAT, model=model, status="200"
    )
    assert (count("a"), count("b"), count("other")) == (1, 1, 2)


async def test_health_metrics_and_ready(make_proxy) -> None:
    proxy = make_proxy()
    assert (await proxy.client.get("/health")).json() == {"status": "ok"}
    assert (await proxy.client.get("/ready")).status_code == 200
    assert proxy.seen[-1].url.path == "/health"
    metrics = (await proxy.client.get("/metrics")).text
    assert "prefill_proxy_in_flight_requests" in metrics

    down = make_proxy(lambda request: httpx.Response(503))
    response = await down.client.get("/ready")
    assert response.status_code == 503 and "upstream" in response.json()["error"]["message"]


async def test_unreachable_upstream_is_502_and_ready_says_so(make_proxy) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    proxy = make_proxy(refuse)
    response = await proxy.client.post(CHAT, content=BODY)
    assert response.status_code == 502
    assert "http://engine:8000" in response.json()["error"]["message"]
    assert proxy.sample("prefill_proxy_upstream_errors_total", kind="connect") == 1
    assert (await proxy.client.get("/ready")).status_code == 503


async def test_upstream_cookies_are_relayed_never_kept_for_other_clients(make_proxy) -> None:
    def sticky(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={}, headers={"set-cookie": "AWSALB=client-a; Path=/"})

    proxy = make_proxy(sticky)
    first = await proxy.client.get("/v1/models")
    assert first.headers["set-cookie"] == "AWSALB=client-a; Path=/"
    proxy.client.cookies.clear()
    await proxy.client.get("/v1/models", headers={"x-client": "b"})
    assert "cookie" not in proxy.seen[1].headers
