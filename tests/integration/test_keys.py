"""The proxy as the exposed edge: client keys (api_keys) checked in constant time, the
upstream's own key (upstream_api_key) sent in their place; /metrics on its own port."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry

from proxy import config
from proxy.app import create_app
from proxy.background import free_port
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import serve

pytestmark = pytest.mark.anyio
CHAT = "/v1/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", "bearer", "Basic a2V5LTE="])
async def test_without_a_valid_key_the_answer_is_401(make_proxy, authorization) -> None:
    proxy = make_proxy(api_keys=("key-1", "key-2"))
    headers = {"authorization": authorization} if authorization else {}
    for path in (CHAT, "/v1/models"):
        response = await proxy.client.post(path, json=BODY, headers=headers)
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["error"]["code"] == "invalid_api_key"
    assert proxy.seen == []
    assert (await proxy.client.get("/health")).status_code == 200  # probes stay open


async def test_a_valid_key_passes_and_the_upstream_gets_its_own(make_proxy) -> None:
    proxy = make_proxy(api_keys=("key-1", "key-2"), upstream_api_key="engine-key")
    response = await proxy.client.post(CHAT, json=BODY, headers={"authorization": "Bearer key-2"})
    assert response.status_code == 200
    assert proxy.seen[-1].headers["authorization"] == "Bearer engine-key"


async def test_without_keys_the_clients_authorization_is_forwarded(make_proxy) -> None:
    proxy = make_proxy()
    await proxy.client.post(CHAT, json=BODY, headers={"authorization": "Bearer theirs"})
    assert proxy.seen[-1].headers["authorization"] == "Bearer theirs"


def test_metrics_on_their_own_port() -> None:
    port = free_port()
    with FakeUpstream() as upstream:
        settings = config.load({"upstream": upstream.url, "metrics_port": port}, environ={})
        with serve(create_app(settings, registry=CollectorRegistry())) as url:
            assert httpx.get(url + "/metrics", timeout=5).status_code == 404
            own = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
            assert own.status_code == 200 and "prefill_proxy_requests_total" in own.text
