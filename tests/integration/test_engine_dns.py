"""The engines behind a host name, resolved for real (getaddrinfo on loopback): what a
Kubernetes headless Service looks like to the proxy."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client import CollectorRegistry

from proxy import config
from proxy.app import create_app
from proxy.engines import resolve_addresses
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import serve


@pytest.mark.anyio
async def test_localhost_resolves_to_the_loopback_address() -> None:
    assert "127.0.0.1" in await resolve_addresses("localhost", 8000)


def test_a_host_name_becomes_its_addresses_and_requests_reach_them() -> None:
    """upstream http://localhost:PORT with upstream_dns_refresh: the engines are the name's
    addresses, resolved before the first request (127.0.0.1; ::1 too where localhost has
    it, which no request reaches once its probe fails), and a chat request reaches one."""
    with FakeUpstream() as upstream:
        port = upstream.url.rsplit(":", 1)[1]
        settings = config.load(
            {
                "upstream": f"http://localhost:{port}",
                "upstream_dns_refresh": 30,
                "engine_probe_interval": 0.05,
            },
            environ={},
        )
        registry = CollectorRegistry()
        with (
            serve(create_app(settings, registry=registry)) as proxy,
            httpx.Client(base_url=proxy, timeout=10) as client,
        ):
            ready = client.get("/ready")  # resolved at start-up, before serving
            assert ready.status_code == 200 and ready.json()["healthy"] >= 1
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        requests = registry.get_sample_value(
            "prefill_proxy_engine_requests_total", {"engine": f"http://127.0.0.1:{port}"}
        )
        assert requests == 1
