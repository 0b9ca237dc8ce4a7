"""End-to-end fixtures: the proxy under a real uvicorn server on a loopback port."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from proxy import config
from proxy.app import create_app
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import serve


class RunningProxy:
    def __init__(self, url: str, registry: CollectorRegistry) -> None:
        self.url = url
        self.registry = registry

    def sample(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait for work the proxy finishes after the client is gone (bounded)."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError("condition not reached in time")
            time.sleep(0.01)


@pytest.fixture
def fake_upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as upstream:
        yield upstream


@pytest.fixture
def start_proxy() -> Iterator[Callable[..., RunningProxy]]:
    stack: list[Any] = []

    def start(upstream: str, **overrides: Any) -> RunningProxy:
        registry = CollectorRegistry()
        settings = config.load({"upstream": upstream, **overrides}, environ={})
        server = serve(create_app(settings, registry=registry))
        url = server.__enter__()
        stack.append(server)
        return RunningProxy(url, registry)

    yield start
    for server in reversed(stack):
        server.__exit__(None, None, None)


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One real vLLM (CPU build, tiny local model) for the whole session; installed and
    built on first use by the project's own scripts (tests/vllm/)."""
    from tests.support import vllm

    vllm.ensure_installed()
    model = vllm.ensure_model()
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with vllm.start(vllm.free_port(), log, model=model) as server:
        yield server
