"""Speculative prefill against a real vLLM (CPU build, the tiny Qwen2 model with its
ChatML/Hermes template): what the warm-up's shape rests on, checked on the engine itself.

- The conversation plus the reply, rendered by /tokenize without a generation prompt, is a
  token prefix of the next request's prompt (which adds the tool result and the
  generation prompt).
- After a tool-call reply the proxy warms that prefix; the next step finds all of its full
  blocks cached. Without the warm-up it finds fewer: the model's tokens for the tool call
  are not the template's re-rendering of it, so the reply's decoded blocks do not match.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.vllm

BLOCK = 32  # tests/vllm/serve.sh: --block-size 32
# In the proxy's canonical form (keys sorted), so it forwards them unchanged.
TOOLS = [
    {
        "function": {
            "description": "Weather for a city",
            "name": "get_weather",
            "parameters": {
                "properties": {"city": {"maxLength": 20, "type": "string"}},
                "required": ["city"],
                "type": "object",
            },
        },
        "type": "function",
    }
]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WARMUPS_OK = {"trigger": "tool_calls", "outcome": "ok"}


def conversation(tag: str) -> list[dict[str, Any]]:
    system = f"{tag}. You are a travel agent. " + " ".join(f"rule{i} holds" for i in range(300))
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"{tag}: what is the weather in Paris?"},
    ]


def tool_call_step(proxy, model: str, messages: list, session: str) -> dict[str, Any]:
    """The first step, its tool call scripted (structured outputs): the reply message."""
    body: dict[str, Any] = {"model": model, "messages": messages, "tools": TOOLS}
    body |= {
        "tool_choice": "auto",
        "max_tokens": 64,
        "temperature": 0,
        "structured_outputs": {"choice": [CALL]},
    }
    response = httpx.post(
        proxy.url + "/v1/chat/completions",
        json=body,
        headers={"x-session-id": session},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    assert message["tool_calls"], message
    calls = [
        {"id": c["id"], "type": "function", "function": c["function"]}
        for c in message["tool_calls"]
    ]
    return {"role": "assistant", "content": message["content"], "tool_calls": calls}


def next_step(proxy, model: str, messages: list, session: str) -> dict[str, Any]:
    """The step with the tool result, streamed (the proxy times its first token): usage."""
    body: dict[str, Any] = {"model": model, "messages": messages, "tools": TOOLS, "max_tokens": 4}
    body |= {"temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    response = httpx.post(
        proxy.url + "/v1/chat/completions",
        json=body,
        headers={"x-session-id": session},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line[6:7] == "{"]
    return next(e["usage"] for e in events if e.get("usage"))


def tokenize(server, messages: list, generation: bool) -> list[int]:
    body: dict[str, Any] = {"model": server.model, "messages": messages, "tools": TOOLS}
    body |= {"add_generation_prompt": generation, "continue_final_message": False}
    response = httpx.post(server.base_url + "/tokenize", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def result(reply: dict[str, Any]) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "Sunny, 21C"}


def test_the_warmed_prefix_is_the_next_prompts_and_is_cached(vllm_server, start_proxy) -> None:
    proxy = start_proxy(vllm_server.base_url)
    messages = conversation("warmed")
    reply = tool_call_step(proxy, vllm_server.model, messages, "warm-1")
    proxy.wait_for(lambda: proxy.sample("prefill_proxy_warmups_total", **WARMUPS_OK) == 1, 60)

    warmed = tokenize(vllm_server, [*messages, reply], generation=False)
    following = [*messages, reply, result(reply)]
    assert tokenize(vllm_server, following, generation=True)[: len(warmed)] == warmed
    first_prompt = len(tokenize(vllm_server, messages, generation=True))

    usage = next_step(proxy, vllm_server.model, following, "warm-1")
    blocks = (len(warmed) - 1) // BLOCK * BLOCK
    assert usage["prompt_tokens_details"]["cached_tokens"] >= blocks
    # The warm-up computed the re-rendered reply (and not the whole conversation again).
    computed = proxy.sample("prefill_proxy_warmup_computed_tokens_total")
    assert 0 < computed <= len(warmed) - first_prompt + BLOCK
    ttft = "prefill_proxy_step_time_to_first_token_seconds_count"
    assert proxy.sample(ttft, warmed="yes") == 1


def test_without_the_warmup_the_next_step_recomputes_the_reply(vllm_server, start_proxy) -> None:
    proxy = start_proxy(vllm_server.base_url, warmup=False)
    messages = conversation("cold")
    reply = tool_call_step(proxy, vllm_server.model, messages, "cold-1")
    warmed = tokenize(vllm_server, [*messages, reply], generation=False)
    usage = next_step(proxy, vllm_server.model, [*messages, reply, result(reply)], "cold-1")
    assert usage["prompt_tokens_details"]["cached_tokens"] < (len(warmed) - 1) // BLOCK * BLOCK
    ttft = "prefill_proxy_step_time_to_first_token_seconds_count"
    assert proxy.sample(ttft, warmed="no") == 1
