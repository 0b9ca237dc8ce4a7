"""``prefill-proxy sim`` over real HTTP (uvicorn on loopback): vLLM's surface and formats."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client import CollectorRegistry

from proxy.sim.app import create_sim_app
from proxy.sim.config import SimConfig
from tests.support.servers import serve

CHAT = "/v1/chat/completions"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
SYSTEM = {"role": "system", "content": "You answer questions about the weather. " * 20}
REPLY = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": "call_7",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
        }
    ],
}


class Sim:
    def __init__(self, url: str, registry: CollectorRegistry, config: SimConfig) -> None:
        self.url = url
        self.registry = registry
        self.config = config
        self.client = httpx.Client(base_url=url, timeout=30)

    def sample(self, name: str, **labels: str) -> float:
        labels = {"model_name": self.config.model_name, "engine": "0", **labels}
        return self.registry.get_sample_value(name, labels) or 0.0

    def chat(self, **body: Any) -> httpx.Response:
        return self.client.post(CHAT, json=body)


@pytest.fixture
def start_sim() -> Iterator[Callable[..., Sim]]:
    servers: list[Any] = []

    def start(**overrides: Any) -> Sim:
        config = SimConfig(**{"speed": 1000.0, "max_model_len": 4096, **overrides})
        registry = CollectorRegistry()
        server = serve(create_sim_app(config, registry=registry))
        servers.append(server)
        return Sim(server.__enter__(), registry, config)

    yield start
    for server in reversed(servers):
        server.__exit__(None, None, None)


@pytest.fixture
def sim(start_sim) -> Sim:
    return start_sim()


def events(body: bytes) -> list[Any]:
    assert body.endswith(b"data: [DONE]\n\n")
    parts = body.split(b"\n\n")
    assert parts[-1] == b"" and parts[-2] == b"data: [DONE]"
    out = []
    for part in parts[:-2]:
        assert part.startswith(b"data: {")
        payload = json.loads(part[6:])
        assert part[6:] == json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
        out.append(payload)
    return out


def messages(*extra: dict) -> list[dict]:
    return [SYSTEM, {"role": "user", "content": "Weather in Paris?"}, *extra]


def test_stream_has_vllms_shape_and_fingerprint_on_the_terminal_chunk(sim) -> None:
    response = sim.chat(messages=messages(), stream=True, max_tokens=5)
    assert response.headers["content-type"].startswith("text/event-stream")
    chunks = events(response.content)
    first, *middle, last = chunks
    assert list(first) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "prompt_token_ids",
        "prompt_text",
    ]
    assert first["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    assert all(
        list(c["choices"][0]) == ["index", "delta", "logprobs", "finish_reason", "token_ids"]
        for c in middle
    )
    assert "system_fingerprint" not in json.dumps(middle)
    assert last["choices"][0]["finish_reason"] == "length"
    assert list(last["choices"][0]) == [
        "index",
        "delta",
        "logprobs",
        "finish_reason",
        "stop_reason",
        "token_ids",
    ]
    assert last["system_fingerprint"] == sim.config.fingerprint
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")
    assert len(middle) + 1 == 5  # one chunk per token: max_tokens=5
    assert "usage" not in json.dumps(chunks)


def test_stream_with_usage_ends_with_a_usage_chunk_that_has_the_fingerprint(sim) -> None:
    options = {"include_usage": True}
    first_chunks = events(
        sim.chat(messages=messages(), stream=True, stream_options=options).content
    )
    chunks = events(sim.chat(messages=messages(), stream=True, stream_options=options).content)
    terminal, usage = chunks[-2], chunks[-1]
    assert (
        terminal["choices"][0]["finish_reason"] == "stop" and "system_fingerprint" not in terminal
    )
    assert list(usage) == [
        "id",
        "object",
        "created",
        "model",
        "choices",
        "usage",
        "system_fingerprint",
    ]
    assert usage["choices"] == []
    prompt = usage["usage"]["prompt_tokens"]
    assert usage["usage"] == {
        "prompt_tokens": prompt,
        "total_tokens": prompt + sim.config.reply_tokens,
        "completion_tokens": sim.config.reply_tokens,
        "prompt_tokens_details": {
            "cached_tokens": (prompt - 1) // 16 * 16,
            "created_cache_tokens": 0,
        },
    }
    cold = first_chunks[-1]["usage"]["prompt_tokens_details"]
    assert cold == {"cached_tokens": 0, "created_cache_tokens": prompt // 16 * 16}


def test_continuous_usage_puts_running_usage_on_every_chunk(sim) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = events(
        sim.chat(messages=messages(), stream=True, max_tokens=3, stream_options=options).content
    )
    counts = [c["usage"]["completion_tokens"] for c in chunks[:-1]]
    assert counts == [0, 1, 2, 3]
    assert chunks[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_non_stream_body_has_vllms_fields_and_usage(sim) -> None:
    body = sim.chat(messages=messages(), max_tokens=4).json()
    assert list(body) == [
        *("id", "object", "created", "model", "choices", "service_tier"),
        *("system_fingerprint", "usage", "prompt_logprobs", "prompt_token_ids"),
        *("prompt_text", "kv_transfer_params", "ec_transfer_params", "metrics"),
    ]
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["role"] == "assistant"
    assert choice["message"]["content"]
    assert body["usage"]["completion_tokens"] == 4
    assert body["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 0,
        "created_cache_tokens": body["usage"]["prompt_tokens"] // 16 * 16,
        "multimodal_tokens": None,
    }


def test_the_synthetic_answer_is_deterministic(sim) -> None:
    one = sim.chat(messages=messages()).json()["choices"][0]["message"]["content"]
    two = sim.chat(messages=messages()).json()["choices"][0]["message"]["content"]
    other = sim.chat(messages=messages({"role": "user", "content": "And Oslo?"})).json()
    assert one == two != other["choices"][0]["message"]["content"]


def test_replayed_tool_call_streams_back_exactly(sim) -> None:
    chunks = events(
        sim.chat(messages=messages(), tools=TOOLS, stream=True, x_replay_reply=REPLY).content
    )
    calls = [
        c["choices"][0]["delta"]["tool_calls"][0]
        for c in chunks
        if c["choices"][0]["delta"].get("tool_calls")
    ]
    assert calls[0] == {
        "id": "call_7",
        "type": "function",
        "index": 0,
        "function": {"name": "get_weather"},
    }
    assert "".join(c["function"]["arguments"] for c in calls[1:]) == '{"city":"Paris"}'
    assert len(calls) > 2  # the arguments arrive in pieces
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"][0]["delta"] == {}
    body = sim.chat(messages=messages(), tools=TOOLS, x_replay_reply=REPLY).json()
    message = body["choices"][0]["message"]
    assert message["content"] is None and message["tool_calls"] == REPLY["tool_calls"]
    assert body["choices"][0]["finish_reason"] == "tool_calls"


def test_replayed_text_streams_back_exactly_and_the_openai_sdk_reads_it(sim) -> None:
    text = "It is sunny in Paris, 21 °C — nice. 🌞\nAnything else?"
    sdk = openai.OpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0)
    stream = sdk.chat.completions.create(
        model=sim.config.model_name,
        messages=messages(),
        stream=True,
        extra_body={"x_replay_reply": {"role": "assistant", "content": text}},
    )
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(pieces) == text and len(pieces) > 5


def test_the_next_request_hits_the_blocks_decoded_for_the_replayed_answer(sim) -> None:
    """The replayed tool call is decoded as the template renders it, so the following
    request (history + that call + its result) finds everything but its own tail cached."""
    sim.chat(messages=messages(), tools=TOOLS, x_replay_reply=REPLY)
    follow = messages(REPLY, {"role": "tool", "tool_call_id": "call_7", "content": "sunny"})
    usage = sim.chat(messages=follow, tools=TOOLS, max_tokens=1).json()["usage"]
    before_result = sim.client.post(
        "/tokenize",
        json={"messages": messages(REPLY), "tools": TOOLS, "add_generation_prompt": False},
    ).json()["count"]
    # Computed before: prompt + answer up to its end-of-turn token (never fed back);
    # before_result is that plus the end-of-turn token and the newline after it.
    assert usage["prompt_tokens_details"]["cached_tokens"] == (before_result - 2) // 16 * 16


def test_max_tokens_cuts_a_replayed_answer(sim) -> None:
    body = sim.chat(
        messages=messages(), max_tokens=2, x_replay_reply={"content": "one two three four five"}
    ).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 2
    assert body["choices"][0]["message"]["content"] == "one two"


def test_tokenize_counts_what_chat_completions_prefills(sim) -> None:
    tokenized = sim.client.post("/tokenize", json={"messages": messages(), "tools": TOOLS}).json()
    assert tokenized["count"] == len(tokenized["tokens"])
    assert tokenized["max_model_len"] == sim.config.max_model_len
    usage = sim.chat(messages=messages(), tools=TOOLS).json()["usage"]
    assert usage["prompt_tokens"] == tokenized["count"]
    no_prompt = sim.client.post(
        "/tokenize", json={"messages": messages(), "tools": TOOLS, "add_generation_prompt": False}
    ).json()
    assert no_prompt["count"] < tokenized["count"]
    text = sim.client.post(
        "/tokenize", json={"prompt": "hello world", "return_token_strs": True}
    ).json()
    assert text["count"] == 2 and "".join(text["token_strs"]) == "hello world"
    back = sim.client.post("/detokenize", json={"tokens": text["tokens"]}).json()
    assert back == {"prompt": "hello world"}


def test_models_and_health(sim) -> None:
    models = sim.client.get("/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == sim.config.model_name
    assert models["data"][0]["max_model_len"] == sim.config.max_model_len
    health = sim.client.get("/health")
    assert health.status_code == 200 and health.content == b""


def test_errors_have_vllms_shape(sim) -> None:
    bad = sim.client.post(CHAT, content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == 400
    assert set(bad.json()["error"]) == {"message", "type", "param", "code"}
    missing = sim.client.post(CHAT, json={"model": sim.config.model_name})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "body.messages"
    wrong_model = sim.chat(model="nope", messages=messages())
    assert wrong_model.status_code == 404 and wrong_model.json()["error"]["type"] == "NotFoundError"
    zero = sim.chat(messages=messages(), max_tokens=0)
    assert zero.json()["error"]["message"].startswith("max_tokens must be at least 1, got 0.")
    huge = sim.chat(messages=messages(), max_tokens=100_000)
    assert huge.status_code == 400 and "cannot be greater than max_model_len" in huge.text
    long = sim.chat(messages=[{"role": "user", "content": "word " * 5000}], stream=True)
    assert long.status_code == 400 and long.headers["content-type"] == "application/json"
    error = long.json()["error"]
    assert error["type"] == "BadRequestError" and error["param"] == "input_tokens"
    assert error["message"].startswith("This model's maximum context length is 4096 tokens.")


def test_unknown_fields_are_ignored(sim) -> None:
    body = sim.chat(messages=messages(), max_tokens=2, temperature=0.3, frobnicate={"x": 1}).json()
    assert body["usage"]["completion_tokens"] == 2


def test_metrics_have_vllms_names_and_count_the_cache(sim) -> None:
    started = time.perf_counter()
    sim.chat(messages=messages(), max_tokens=3)
    usage = sim.chat(messages=messages(), max_tokens=3).json()["usage"]
    elapsed = time.perf_counter() - started
    text = sim.client.get("/metrics").text
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:request_prefill_time_seconds_count",
        "vllm:request_decode_time_seconds_count",
    ):
        assert f'{name}{{engine="0",model_name="{sim.config.model_name}"' in text or (
            f'{name}{{engine="0",le=' in text
        ), name
    prompt = usage["prompt_tokens"]
    assert sim.sample("vllm:prompt_tokens_total") == 2 * prompt
    assert sim.sample("vllm:prefix_cache_queries_total") == 2 * prompt
    assert (
        sim.sample("vllm:prefix_cache_hits_total")
        == usage["prompt_tokens_details"]["cached_tokens"]
        > 0
    )
    assert sim.sample("vllm:generation_tokens_total") == 6
    assert sim.sample("vllm:time_to_first_token_seconds_count") == 2
    assert sim.sample("vllm:num_requests_running") == 0
    assert sim.sample("vllm:kv_cache_usage_perc") == 0
    # The simulator's own: the steps' modelled time, which the requests waited out.
    busy = sim.sample("sim:engine_busy_seconds_total")
    assert 0 < sim.sample("sim:engine_compute_seconds_total") < busy <= elapsed


def test_reset_prefix_cache_makes_the_next_run_cold(sim) -> None:
    sim.chat(messages=messages(), max_tokens=1)
    assert (
        sim.chat(messages=messages(), max_tokens=1).json()["usage"]["prompt_tokens_details"][
            "cached_tokens"
        ]
        > 0
    )
    reset = sim.client.post("/reset_prefix_cache")
    assert reset.status_code == 200 and reset.json() == {"success": True}
    assert (
        sim.chat(messages=messages(), max_tokens=1).json()["usage"]["prompt_tokens_details"][
            "cached_tokens"
        ]
        == 0
    )


def test_cache_salt_separates_tenants(sim) -> None:
    def cached(**extra: Any) -> int:
        body = sim.chat(messages=messages(), max_tokens=1, **extra).json()
        return body["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached() == 0
    assert cached(cache_salt="tenant-1") == 0
    assert cached(cache_salt="tenant-1") > 0
    assert sim.chat(messages=messages(), cache_salt="").status_code == 400


def test_a_client_that_leaves_mid_stream_frees_the_engine(start_sim) -> None:
    sim = start_sim(speed=1.0)  # ~6.5 ms per token: 4000 tokens would take ~26 s
    request = {"messages": messages(), "stream": True, "max_tokens": 4000, "ignore_eos": True}
    with sim.client.stream("POST", CHAT, json=request) as response:
        lines = response.iter_lines()
        for _ in range(10):
            next(lines)
        assert sim.sample("vllm:num_requests_running") == 1
        assert sim.sample("vllm:kv_cache_usage_perc") > 0
    deadline = 200
    while sim.sample("vllm:num_requests_running") and deadline:
        deadline -= 1
        sim.client.get("/health")  # a round trip lets the server notice the disconnect
    assert sim.sample("vllm:num_requests_running") == 0
    assert sim.sample("vllm:kv_cache_usage_perc") == 0
    assert sim.sample("vllm:generation_tokens_total") < 1000
