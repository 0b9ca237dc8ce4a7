"""Real agent clients drive a two-step tool loop through the proxy against real vLLM: step
one forces a tool call, the client runs the tool, step two sends its result back.

The assertions are on the traffic the proxy saw (tests/support/recording.py), not only on
the client finishing: both requests, the tool call and its result in the second one, the
same call in what went upstream, and the proxy's metrics.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from proxy import prefix
from tests.clients import vercel_ai, weather
from tests.support.recording import Exchange, RecordedProxy, recorded_proxy, tool_round

pytestmark = [
    pytest.mark.vllm,
    # litellm's lazily built types, each time it streams: not ours to fix.
    pytest.mark.filterwarnings("ignore:Item .* is using the `ReadOnly` qualifier:UserWarning"),
]

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"


@dataclasses.dataclass(frozen=True)
class Client:
    module: str  # in tests/clients/, with run(base_url, model, *, stream) -> str
    reserializes_arguments: bool = False  # sends a tool call's arguments back re-encoded
    asks_usage: bool = False  # sets stream_options.include_usage on its streams
    needs_node: bool = False

    def run(self, proxy: RecordedProxy, model: str, *, stream: bool, entry: str = "run") -> str:
        if self.needs_node and vercel_ai.node() is None:
            pytest.skip("node is not installed")
        driver = importlib.import_module(f"tests.clients.{self.module}")
        return getattr(driver, entry)(proxy.url + "/v1", model, stream=stream)


CLIENTS = {
    "openai-python": Client("openai_python"),
    "openai-agents": Client("openai_agents"),
    "langchain": Client("langchain_agent", reserializes_arguments=True),
    "vercel-ai": Client("vercel_ai", needs_node=True),
    "litellm": Client("litellm_sdk"),
    "pydantic-ai": Client("pydantic_ai_agent", asks_usage=True),
}


@pytest.fixture
def proxy(vllm_server) -> Iterator[RecordedProxy]:
    with recorded_proxy(vllm_server.base_url) as proxy:
        yield proxy


def requests_answered(proxy: RecordedProxy, route: str) -> float:
    return proxy.total("prefill_proxy_requests_total", route=route, status="200")


def has_usage(exchange: Exchange) -> bool:
    return any(event.get("usage") for event in exchange.response_events())


@pytest.mark.parametrize("stream", [False, True], ids=["non-stream", "stream"])
@pytest.mark.parametrize("name", list(CLIENTS))
def test_tool_loop_through_the_proxy(name: str, stream: bool, proxy, vllm_server) -> None:
    client = CLIENTS[name]
    client.run(proxy, vllm_server.model, stream=stream)

    assert [(e.method, e.path, e.status) for e in proxy.exchanges] == [("POST", CHAT, 200)] * 2
    for exchange in proxy.chat:
        assert exchange.json().get("stream", False) is stream
    loop = tool_round(proxy)
    assert loop.name == weather.NAME
    arguments = json.loads(loop.emitted)
    assert arguments["city"] in weather.CITIES
    assert loop.result == weather.get_weather(arguments["city"])
    assert json.loads(loop.sent_back) == arguments
    if client.reserializes_arguments:
        assert loop.sent_back == json.dumps(arguments) != loop.emitted
    else:
        assert loop.sent_back == loop.emitted
    # History restoration: whatever the client sent back, vLLM gets the emitted bytes.
    assert loop.forwarded == loop.emitted
    proxy.wait_for(lambda: requests_answered(proxy, CHAT) == 2)
    # Step two continues step one exactly (the reply restored where the client re-encoded).
    breaks = {
        r: proxy.sample("prefill_proxy_prefix_breaks_total", reason=r) for r in prefix.REASONS
    }
    assert breaks == {**dict.fromkeys(prefix.REASONS, 0.0), "new_session": 1.0, "none": 1.0}

    if stream:  # the proxy asks every stream for usage; only those that asked get it
        for exchange in proxy.chat:
            assert has_usage(exchange) is client.asks_usage
    labels = {"route": CHAT, "model": vllm_server.model}
    proxy.wait_for(lambda: requests_answered(proxy, CHAT) == 2)
    assert proxy.sample("prefill_proxy_requests_total", status="200", **labels) == 2
    assert proxy.sample("prefill_proxy_prompt_tokens_total", **labels) > 0
    assert proxy.sample("prefill_proxy_completion_tokens_total", **labels) > 0
    first_tokens = proxy.sample("prefill_proxy_time_to_first_token_seconds_count", **labels)
    assert first_tokens == (2 if stream else 0)


def test_langchain_reserialized_arguments_reach_vllm_when_nothing_rewrites(vllm_server) -> None:
    """LangChain sends ``{"city": "Paris"}`` back for the model's ``{"city":"Paris"}``;
    without the proxy's rewrites that text reaches vLLM, and the prefix breaks there."""
    with recorded_proxy(vllm_server.base_url, rewrite=False) as proxy:
        CLIENTS["langchain"].run(proxy, vllm_server.model, stream=False)
        loop = tool_round(proxy)
    assert loop.emitted == json.dumps(json.loads(loop.emitted), separators=(",", ":"))
    assert loop.sent_back == json.dumps(json.loads(loop.emitted)) != loop.emitted
    assert loop.forwarded == loop.sent_back


# Clients on the Responses API, with the streams each runs: the Agents SDK refuses a final
# answer that is not "completed" without a stream (a random model ends at
# max_output_tokens), so it runs streamed only.
RESPONSES_CLIENTS = [
    ("openai-agents", True),
    ("openai-python", False),
    ("openai-python", True),
    ("vercel-ai", False),
    ("vercel-ai", True),
]


def emitted_items(exchange: Exchange) -> list[dict[str, Any]]:
    """A response's output items as the engine emitted them (the terminal event's)."""
    events = exchange.response_events()
    terminal = [
        e["response"]
        for e in events
        if e.get("type") in ("response.completed", "response.incomplete")
    ]
    return (terminal or events)[-1]["output"]


@pytest.mark.parametrize(("name", "stream"), RESPONSES_CLIENTS)
def test_tool_loop_on_the_responses_api(name: str, stream: bool, proxy, vllm_server) -> None:
    """Each client's two-step loop on /v1/responses: step two continues step one exactly,
    the call going upstream as vLLM emitted it whatever the client sent back."""
    CLIENTS[name].run(proxy, vllm_server.model, stream=stream, entry="run_on_responses")

    assert [(e.path, e.status) for e in proxy.exchanges] == [(RESPONSES, 200)] * 2
    first, second = proxy.exchanges
    assert second.json().get("stream", False) is stream
    (emitted,) = [item for item in emitted_items(first) if item["type"] == "function_call"]
    assert json.loads(emitted["arguments"])["city"] in weather.CITIES
    sent = [item for item in second.json()["input"] if item.get("type") == "function_call"]
    forwarded = [
        item for item in proxy.forwarded[1]["input"] if item.get("type") == "function_call"
    ]
    assert [item["call_id"] for item in sent] == [emitted["call_id"]]
    assert forwarded == [emitted]  # the emitted item, byte for byte (as JSON: same order)
    assert json.dumps(forwarded[0]) == json.dumps(emitted)
    if name == "openai-python":  # it re-encodes the arguments
        assert sent[0]["arguments"] != emitted["arguments"]
    (output,) = [
        item for item in second.json()["input"] if item.get("type") == "function_call_output"
    ]
    assert output["output"] == weather.get_weather(json.loads(emitted["arguments"])["city"])

    proxy.wait_for(lambda: requests_answered(proxy, RESPONSES) == 2)
    breaks = {
        r: proxy.sample("prefill_proxy_prefix_breaks_total", reason=r) for r in prefix.REASONS
    }
    assert breaks == {**dict.fromkeys(prefix.REASONS, 0.0), "new_session": 1.0, "none": 1.0}
    labels = {"route": RESPONSES, "model": vllm_server.model}
    assert proxy.sample("prefill_proxy_prompt_tokens_total", **labels) > 0
    assert proxy.sample("prefill_proxy_cached_prompt_tokens_total", **labels) > 0
    assert proxy.sample("prefill_proxy_completion_tokens_total", **labels) > 0
    first_tokens = proxy.sample("prefill_proxy_time_to_first_token_seconds_count", **labels)
    assert first_tokens == (2 if stream else 0)


@pytest.mark.parametrize("stream", [False, True], ids=["non-stream", "stream"])
def test_responses_api_answer_through_the_proxy(stream: bool, proxy, vllm_server) -> None:
    request: dict[str, Any] = {
        "model": vllm_server.model,
        "input": weather.PROMPT,
        "max_output_tokens": 16,
        "temperature": 0.0,
        # A random model never stops by itself: a scripted answer ends as "completed".
        "extra_body": {"structured_outputs": {"choice": ["Sunny in Paris."]}},
    }
    base_url = proxy.url + "/v1"
    with openai.OpenAI(base_url=base_url, api_key=weather.API_KEY, max_retries=0) as client:
        if stream:
            events = list(client.responses.create(**request, stream=True))
            assert [events[0].type, events[-1].type] == ["response.created", "response.completed"]
            response = events[-1].response
        else:
            response = client.responses.create(**request)
    assert response.status == "completed"
    assert response.output_text == "Sunny in Paris."
    assert response.usage is not None and response.usage.input_tokens > 0

    (exchange,) = proxy.exchanges
    assert (exchange.path, exchange.status) == (RESPONSES, 200)
    assert exchange.json().get("stream", False) is stream
    proxy.wait_for(lambda: requests_answered(proxy, RESPONSES) == 1)
