"""The proxy in front of a real vLLM (CPU build) serving a tiny random model, driven by the
openai SDK. Slow to start (~30 s, once per session), so the tests share one server."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

pytestmark = pytest.mark.vllm

CHAT = "/v1/chat/completions"
SAMPLING = {"temperature": 0.0, "max_tokens": 8}


@pytest.fixture
def proxy(vllm_server, start_proxy):
    return start_proxy(vllm_server.base_url)


@pytest.fixture
def sdk(proxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-not-checked", max_retries=0)


def long_prompt(tag: str, words: int = 1600) -> str:
    """About 2k tokens of text, distinct per tag (so other tests' cache does not help)."""
    vocabulary = ["import", "return", "value", "self", "class", "def", "list", "for", "data"]
    return tag + " " + " ".join(f"{vocabulary[i % 9]}{i % 97}" for i in range(words))


def vllm_metric(server, name: str, label: str = "") -> float:
    """Sum of a vLLM metric's samples, optionally only those carrying ``label``."""
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + "{", name + " ")) and label in line
    )


def wait_for_metric(server, name: str, value: float, label: str = "", timeout=30.0) -> None:
    deadline = time.monotonic() + timeout
    while (seen := vllm_metric(server, name, label)) != value:
        assert time.monotonic() < deadline, f"{name} stayed {seen}, expected {value}"
        time.sleep(0.05)


def normalise(body: bytes) -> tuple[str, list[dict]]:
    """(all the content, the stream's other events) without per-request ids and timestamps.
    How many tokens vLLM puts in one chunk depends on timing (under load it sends "lowlow"
    where a quiet engine sends "low", "low"), so content is compared as one string; the
    byte-exact relay is pinned against the fake upstream (tests/e2e/test_faults.py)."""
    content: list[str] = []
    events: list[dict] = []
    for event in body.split(b"\n\n"):
        if not event.startswith(b"data: {"):
            if event:
                events.append({"raw": event.decode()})
            continue
        payload = json.loads(event[6:])
        payload.pop("id"), payload.pop("created")
        for choice in payload.get("choices", []):
            content.append(choice.get("delta", {}).pop("content", ""))
        choices = payload.get("choices", [])
        if not (choices and all(c["delta"] == {} and c["finish_reason"] is None for c in choices)):
            events.append(payload)  # the role chunk, the terminal chunk, anything unusual
    return "".join(content), events


def test_chat_non_stream(sdk, proxy, vllm_server) -> None:
    reply = sdk.chat.completions.create(
        model=vllm_server.model, messages=[{"role": "user", "content": "hello"}], **SAMPLING
    )
    assert reply.choices[0].finish_reason in ("length", "stop")
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    labels = {"route": CHAT, "model": vllm_server.model}
    assert proxy.sample("prefill_proxy_prompt_tokens_total", **labels) == reply.usage.prompt_tokens
    assert proxy.sample("prefill_proxy_completion_tokens_total", **labels) == (
        reply.usage.completion_tokens
    )


def test_stream_is_what_vllm_sends_a_client_that_did_not_ask_for_usage(proxy, vllm_server) -> None:
    request = {
        "model": vllm_server.model,
        "stream": True,
        **SAMPLING,
        "messages": [{"role": "user", "content": "stream please"}],
    }
    with httpx.Client(timeout=60) as client:
        direct = client.post(vllm_server.base_url + CHAT, json=request).content
        proxied = client.post(proxy.url + CHAT, json=request).content
    assert normalise(proxied) == normalise(direct)
    assert b'"usage"' not in proxied and proxied.endswith(b"data: [DONE]\n\n")
    labels = {"route": CHAT, "model": vllm_server.model}
    assert proxy.sample("prefill_proxy_prompt_tokens_total", **labels) > 0  # usage was asked
    assert proxy.sample("prefill_proxy_time_to_first_token_seconds_count", **labels) == 1
    assert proxy.sample("prefill_proxy_decode_seconds_count", **labels) == 1


def test_stream_with_usage_asked_by_the_client(sdk, vllm_server) -> None:
    chunks = list(
        sdk.chat.completions.create(
            model=vllm_server.model,
            messages=[{"role": "user", "content": "count"}],
            stream=True,
            stream_options={"include_usage": True},
            **SAMPLING,
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == SAMPLING["max_tokens"]


def test_forced_tool_call(sdk, vllm_server) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                    "required": ["city"],
                },
            },
        }
    ]
    reply = sdk.chat.completions.create(
        model=vllm_server.model,
        messages=[{"role": "user", "content": "weather in Paris?"}],
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        temperature=0.0,
        max_tokens=32,
    )
    call = reply.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Oslo")


def test_repeated_long_prompt_is_cached_and_the_proxy_counts_it(proxy, vllm_server) -> None:
    """Streams without usage asked: only the proxy's injected include_usage can see it."""
    request = {
        "model": vllm_server.model,
        "stream": True,
        "max_tokens": 2,
        "temperature": 0.0,
        "messages": [{"role": "user", "content": long_prompt("cache-test")}],
    }
    labels = {"route": CHAT, "model": vllm_server.model}

    def counted(name: str) -> float:
        return proxy.sample(f"prefill_proxy_{name}_total", **labels)

    def send(client: httpx.Client) -> tuple[float, float]:
        """The request's prompt and cached tokens, as the proxy counted them."""
        prompt, cached, completion = (
            counted(n) for n in ("prompt_tokens", "cached_prompt_tokens", "completion_tokens")
        )
        client.post(proxy.url + CHAT, json=request).raise_for_status()
        # Read in process from another thread, the counters may still be being written
        # just after the client has the end (the completion tokens are counted last).
        proxy.wait_for(lambda: counted("completion_tokens") > completion)
        return counted("prompt_tokens") - prompt, counted("cached_prompt_tokens") - cached

    with httpx.Client(timeout=120) as client:
        seen = [send(client), send(client)]
    (prompt1, cached1), (prompt2, cached2) = seen
    assert prompt1 == prompt2 >= 2000
    assert cached1 < prompt1 / 2  # cold: at most a shared template block or two
    block = 32  # vLLM's --block-size in tests/vllm/serve.sh; the last token is recomputed
    assert cached2 == (prompt2 - 1) // block * block
    computed = proxy.sample("prefill_proxy_computed_prompt_tokens_total", **labels)
    assert computed == prompt1 + prompt2 - cached1 - cached2


def test_client_disconnect_aborts_the_request_in_vllm(proxy, vllm_server) -> None:
    """A 4000-token generation takes this engine about a minute; the client leaves after a
    few tokens, and vLLM must stop the request at once (not run it to the end)."""
    request = {
        "model": vllm_server.model,
        "stream": True,
        "max_tokens": 4000,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": "go on forever"}],
    }
    generated_before = vllm_metric(vllm_server, "vllm:generation_tokens_total")
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", proxy.url + CHAT, json=request) as response,
    ):
        for index, _ in enumerate(response.iter_lines()):
            # Keep reading (vLLM pauses a stream nobody reads) until the engine shows it.
            if index % 10 == 0 and vllm_metric(vllm_server, "vllm:num_requests_running"):
                break
            assert index < 3000, "vLLM never reported the request as running"
    wait_for_metric(vllm_server, "vllm:num_requests_running", 0)
    generated = vllm_metric(vllm_server, "vllm:generation_tokens_total") - generated_before
    assert generated < 2000, f"vLLM generated {generated} tokens for a client that had left"
    proxy.wait_for(lambda: proxy.sample("prefill_proxy_client_disconnects_total", route=CHAT) == 1)


def test_passthrough_routes(proxy, vllm_server) -> None:
    with httpx.Client(base_url=proxy.url, timeout=60) as client:
        models = client.get("/v1/models").json()
        assert models["data"][0]["max_model_len"] == 16384
        tokens = client.post(
            "/tokenize",
            json={
                "model": vllm_server.model,
                "messages": [{"role": "user", "content": "hi"}],
                "add_generation_prompt": True,
            },
        ).json()
        assert tokens["count"] == len(tokens["tokens"]) > 0
        text = client.post(
            "/detokenize", json={"model": vllm_server.model, "tokens": tokens["tokens"]}
        ).json()
        assert "hi" in text["prompt"]
        completion = client.post(
            "/v1/completions",
            json={
                "model": vllm_server.model,
                "prompt": "def f(",
                "max_tokens": 4,
                "temperature": 0,
            },
        ).json()
        assert completion["usage"]["completion_tokens"] == 4
        assert client.get("/ready").status_code == 200


def test_upstream_error_passes_through(sdk, vllm_server) -> None:
    with pytest.raises(openai.BadRequestError):
        sdk.chat.completions.create(
            model=vllm_server.model,
            messages=[{"role": "user", "content": "x"}],
            max_tokens=100_000,
        )


def test_big_continued_requests_go_early_to_vllm_and_count_the_same(
    vllm_server, start_proxy
) -> None:
    """vLLM (uvicorn, httptools) reads a request begun early with a chunked body like any
    other: each step's prompt counts the same tokens as through a proxy that sends whole
    bodies. The bodies are big in bytes and small in tokens (JSON whitespace between the
    messages), so a tool loop passes early_upload_bytes within the tiny model's context."""
    gap = ",\n" + " " * (20 << 10)
    messages = [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Look up reservation R1."},
    ]
    steps = []
    for step in range(4):
        call = {"id": f"call_{step}", "type": "function"}
        call["function"] = {"name": "lookup", "arguments": '{"id": "R1"}'}
        head = json.dumps({"model": vllm_server.model, "max_tokens": 2, "temperature": 0.0})
        listed = gap.join(json.dumps(message) for message in messages)
        steps.append(head[:-1].encode() + b', "messages": [' + listed.encode() + b"]}")
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{step}", "content": f"seat {step}A"},
        ]
    assert len(steps[0]) < 32 << 10 < len(steps[1])  # the first is too small to be kept
    counted = {}
    for threshold in (0, 32 << 10):
        proxy = start_proxy(vllm_server.base_url, early_upload_bytes=threshold)
        with httpx.Client(timeout=120) as client:
            replies = [
                client.post(
                    proxy.url + CHAT, content=body, headers={"content-type": "application/json"}
                )
                for body in steps
            ]
        assert [reply.status_code for reply in replies] == [200] * len(steps)
        counted[threshold] = [reply.json()["usage"]["prompt_tokens"] for reply in replies]
        used = proxy.sample("prefill_proxy_early_uploads_total", outcome="used")
        discarded = proxy.sample("prefill_proxy_early_uploads_total", outcome="discarded")
        assert (used, discarded) == ((0, 0) if threshold == 0 else (len(steps) - 2, 0))
    assert counted[0] == counted[32 << 10]
    assert counted[0] == sorted(counted[0]) and counted[0][0] < counted[0][-1]
