"""The app in process: ASGI on the client side, httpx.MockTransport as the upstream."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from proxy import config
from proxy.app import create_app
from proxy.rewrite import Transform
from tests.support.fake_upstream import completion_body

Handler = Callable[[httpx.Request], httpx.Response]


def ok_completion(request: httpx.Request) -> httpx.Response:
    return httpx.Response(
        200, content=completion_body(), headers={"content-type": "application/json"}
    )


@dataclasses.dataclass
class Harness:
    registry: CollectorRegistry
    seen: list[httpx.Request]
    client: httpx.AsyncClient

    def sample(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def upstream_json(self, index: int = -1) -> Any:
        return json.loads(self.seen[index].content)


@pytest.fixture
def make_proxy() -> Callable[..., Any]:
    clients: list[httpx.AsyncClient] = []

    def build(
        handler: Handler = ok_completion,
        transforms: list[Transform] | None = None,
        **overrides: Any,
    ) -> Harness:
        seen: list[httpx.Request] = []

        def record(request: httpx.Request) -> httpx.Response:
            request.read()
            seen.append(request)
            return handler(request)

        settings = config.load({"upstream": "http://engine:8000", **overrides}, environ={})
        registry = CollectorRegistry()
        app = create_app(
            settings,
            transport=httpx.MockTransport(record),
            registry=registry,
            transforms=transforms,
        )
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy")
        clients.append(client)
        return Harness(registry, seen, client)

    return build
