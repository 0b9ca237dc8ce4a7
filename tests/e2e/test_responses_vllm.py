"""What real vLLM 0.32 does with ``previous_response_id`` through the proxy: without
``VLLM_ENABLE_RESPONSES_API_STORE`` (its default) nothing is stored and a chained request
is its 404, relayed unchanged; with it, a chain works, and the proxy sends the chained
request as the client wrote it (the engine holds the history)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.clients import weather
from tests.support.recording import RecordedProxy, recorded_proxy

pytestmark = pytest.mark.vllm

ROUTE = "/v1/responses"
TOOL = {"type": "function", **weather.openai_tool()["function"]}


@pytest.fixture(scope="module")
def storing_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.support import vllm

    vllm.ensure_installed()
    model = vllm.ensure_model()
    log = tmp_path_factory.mktemp("vllm-store") / "vllm.log"
    env = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}
    with vllm.start(vllm.free_port(), log, model=model, env=env) as server:
        yield server


def first_step(proxy: RecordedProxy, model: str) -> dict[str, Any]:
    body = {
        "model": model,
        "instructions": "Answer with the weather tool.",
        "input": weather.PROMPT,
        "tools": [TOOL],
        "tool_choice": {"type": "function", "name": weather.NAME},
        "max_output_tokens": weather.MAX_TOKENS,
        "temperature": 0.0,
    }
    answer = httpx.post(proxy.url + ROUTE, json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return answer.json()


def chained(response: dict[str, Any], model: str) -> dict[str, Any]:
    (call,) = [item for item in response["output"] if item["type"] == "function_call"]
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
    return {
        "model": model,
        "previous_response_id": response["id"],
        "input": [output],
        "tools": [TOOL],
        "max_output_tokens": 8,
    }


def test_a_chain_on_a_storing_engine(storing_vllm) -> None:
    with recorded_proxy(storing_vllm.base_url) as proxy:
        first = first_step(proxy, storing_vllm.model)
        body = chained(first, storing_vllm.model)
        answer = httpx.post(proxy.url + ROUTE, json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        assert proxy.forwarded[1]["input"] == body["input"]
        assert proxy.forwarded[1]["previous_response_id"] == first["id"]
        # The engine rendered the stored conversation before the new item.
        assert answer.json()["usage"]["input_tokens"] > first["usage"]["input_tokens"]
        proxy.wait_for(lambda: proxy.total("prefill_proxy_requests_total", route=ROUTE) == 2)
        assert proxy.sample("prefill_proxy_prefix_breaks_total", reason="engine_history") == 1


def test_without_the_store_a_chain_is_the_engines_404(vllm_server) -> None:
    with recorded_proxy(vllm_server.base_url) as proxy:
        first = first_step(proxy, vllm_server.model)
        body = chained(first, vllm_server.model)
        direct = httpx.post(vllm_server.base_url + ROUTE, json=body, timeout=60)
        through = httpx.post(proxy.url + ROUTE, json=body, timeout=60)
    assert direct.status_code == through.status_code == 404
    assert through.json() == direct.json()
    assert "not found" in through.json()["error"]["message"]
