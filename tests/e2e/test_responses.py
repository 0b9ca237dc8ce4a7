"""/v1/responses through the proxy (real uvicorn both sides) in front of the simulator,
which speaks vLLM 0.32's Responses format: the chat pipeline on the other wire format.

What real vLLM and the real clients do on this route is tests/e2e/test_clients.py's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client import CollectorRegistry

from proxy import prefix
from proxy.rewrite.volatile import NOTE_HEADER
from proxy.sim.app import create_sim_app
from proxy.sim.config import SimConfig
from proxy.sim.reply import REPLAY_FIELD
from tests.support.recording import RecordedProxy, recorded_proxy
from tests.support.servers import serve

ROUTE = "/v1/responses"
MODEL = SimConfig().model_name
TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
    {
        "type": "function",
        "name": "book_table",
        "description": "Book a table.",
        "parameters": {"type": "object", "properties": {"time": {"type": "string"}}},
    },
]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
}
INSTRUCTIONS = "You answer questions about the weather. " * 20 + "\nCurrent time: {now}"


@pytest.fixture
def sim() -> Iterator[str]:
    config = SimConfig(speed=1000.0, max_model_len=8192)
    with serve(create_sim_app(config, registry=CollectorRegistry())) as url:
        yield url


@pytest.fixture
def proxy(sim: str) -> Iterator[RecordedProxy]:
    with recorded_proxy(sim) as proxy:
        yield proxy


def client(proxy: RecordedProxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0)


def ask(proxy: RecordedProxy, *, stream: bool, **body: Any) -> Any:
    """One response, streamed or not, as openai-python's Response object."""
    with client(proxy) as c:
        if not stream:
            return c.responses.create(**body)
        events = list(c.responses.create(**body, stream=True))
        assert events[0].type == "response.created"
        assert events[-1].type == "response.completed"
        return events[-1].response


def breaks(proxy: RecordedProxy) -> dict[str, float]:
    return {r: proxy.sample("prefill_proxy_prefix_breaks_total", reason=r) for r in prefix.REASONS}


def resent(item: dict[str, Any]) -> dict[str, Any]:
    """A function call as a framework sends it back: re-serialized arguments, no id or
    status, its keys in another order."""
    arguments = json.dumps(json.loads(item["arguments"]))
    return {
        "type": "function_call",
        "name": item["name"],
        "call_id": item["call_id"],
        "arguments": arguments,
    }


@pytest.mark.parametrize("stream", [False, True], ids=["non-stream", "stream"])
def test_a_tool_loop_continues_exactly(stream: bool, proxy: RecordedProxy) -> None:
    """Step two re-sends step one's call re-serialized, under a new clock: the engine gets
    the call as emitted and a system prompt that did not change, so its prefix holds."""
    user = {"role": "user", "content": "Weather in Paris?"}
    first = ask(
        proxy,
        stream=stream,
        model=MODEL,
        instructions=INSTRUCTIONS.format(now="2026-12-02 10:15:42"),
        input=[user],
        tools=TOOLS,
        extra_body={REPLAY_FIELD: {"tool_calls": [CALL]}},
    )
    (emitted,) = [item.model_dump() for item in first.output]
    assert emitted["type"] == "function_call"
    output = {"type": "function_call_output", "call_id": emitted["call_id"], "output": "Sunny"}
    second = ask(
        proxy,
        stream=stream,
        model=MODEL,
        instructions=INSTRUCTIONS.format(now="2026-12-02 10:15:49"),
        input=[user, resent(emitted), output],
        tools=list(reversed(TOOLS)),
        extra_body={REPLAY_FIELD: {"content": "It is sunny."}},
    )
    assert second.output_text == "It is sunny."

    sent, forwarded = proxy.exchanges[1].json(), proxy.forwarded[1]
    assert sent["input"][1] != emitted
    assert forwarded["input"][1] == {k: v for k, v in emitted.items() if v is not None}
    assert forwarded["instructions"] == proxy.forwarded[0]["instructions"]
    assert "10:15" not in forwarded["instructions"]
    assert forwarded["tools"] == proxy.forwarded[0]["tools"]  # one order, whatever was sent
    assert NOTE_HEADER in forwarded["input"][-1]["output"]
    assert "10:15:49" in forwarded["input"][-1]["output"]
    proxy.wait_for(lambda: proxy.total("prefill_proxy_requests_total", route=ROUTE) == 2)
    assert breaks(proxy) == {**dict.fromkeys(prefix.REASONS, 0.0), "new_session": 1.0, "none": 1.0}
    # The engine found the whole first step cached (its prompt, not the reply's tokens).
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 32
    labels = {"route": ROUTE, "model": MODEL}
    assert proxy.sample("prefill_proxy_prompt_tokens_total", **labels) == (
        first.usage.input_tokens + second.usage.input_tokens
    )
    assert proxy.sample("prefill_proxy_cached_prompt_tokens_total", **labels) == (
        first.usage.input_tokens_details.cached_tokens
        + second.usage.input_tokens_details.cached_tokens
    )
    ttfts = proxy.sample("prefill_proxy_time_to_first_token_seconds_count", **labels)
    assert ttfts == (2 if stream else 0)


def test_a_stream_is_relayed_byte_for_byte(sim: str, proxy: RecordedProxy) -> None:
    body = {
        "model": MODEL,
        "input": "hi",
        "stream": True,
        REPLAY_FIELD: {"content": "Hello there, friend."},
    }
    direct = httpx.post(sim + ROUTE, json=body, timeout=30)
    through = httpx.post(proxy.url + ROUTE, json=body, timeout=30)
    assert through.status_code == 200
    assert through.headers["content-type"].startswith("text/event-stream")

    def shape(raw: bytes) -> list[Any]:  # ids and timings differ between two responses
        events = [line for line in raw.split(b"\n") if line.startswith(b"event: ")]
        return events

    assert shape(through.content) == shape(direct.content)
    # The client got exactly what the engine sent the proxy: nothing was inserted, dropped
    # or re-encoded (the request had nothing to rewrite, so it went as the client's bytes).
    (exchange,) = proxy.exchanges[-1:]
    assert exchange.response == through.content
    assert json.dumps(proxy.forwarded[-1]) == json.dumps(body)  # nothing to rewrite


def test_an_engine_error_reaches_the_client_unchanged(sim: str, proxy: RecordedProxy) -> None:
    body = {"model": MODEL, "previous_response_id": "resp_gone", "input": "and then?"}
    direct = httpx.post(sim + ROUTE, json=body, timeout=30)
    through = httpx.post(proxy.url + ROUTE, json=body, timeout=30)
    assert (
        (through.status_code, through.content)
        == (direct.status_code, direct.content)
        == (
            404,
            direct.content,
        )
    )
    proxy.wait_for(lambda: proxy.total("prefill_proxy_requests_total", route=ROUTE) == 1)
    assert proxy.sample("prefill_proxy_prefix_breaks_total", reason="engine_history") == 1


def test_a_request_the_mapping_cannot_read_goes_as_sent(sim: str, proxy: RecordedProxy) -> None:
    body = {"model": MODEL, "input": 42}
    direct = httpx.post(sim + ROUTE, json=body, timeout=30)
    through = httpx.post(proxy.url + ROUTE, json=body, timeout=30)
    assert (through.status_code, through.content) == (direct.status_code, direct.content)
    assert through.status_code == 400
