"""Compaction end to end: a long agent session through the proxy, on the simulator (its
paged prefix cache and context limit) and on real vLLM (its context-overflow error)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from proxy.compaction import plan
from proxy.compaction.summarizer import SUMMARY_HEADER
from proxy.replay import synthetic, traces
from proxy.replay.records import Run
from proxy.replay.runner import Options, Replayer, make_client
from tests.support.conversations import is_valid_conversation
from tests.support.recording import recorded_proxy
from tests.support.servers import serve

LIMIT = 12_288
HIGH = int(LIMIT * 0.75)


def replay(url: str, conversations: list[traces.Conversation]) -> Run:
    async def go() -> Run:
        async with make_client(1, 60) as http:
            return await Replayer(http, url, Options(model="sim-model")).run(conversations)

    return asyncio.run(go())


def test_a_long_session_compacts_under_the_high_watermark_with_a_stable_prefix() -> None:
    """90 model calls of a synthetic agent session (head of ~4.7k tokens) on an engine
    with a 12k context, which the proxy reads from /v1/models: every prompt stays under
    the high watermark, old turns become a summary right after the head, and between two
    compaction events the engine finds nearly the whole prompt cached."""
    from proxy.sim.app import create_sim_app
    from proxy.sim.config import SimConfig

    session = [traces.parse(record) for record in synthetic.generate(1, 7, steps=90)]
    with (
        serve(create_sim_app(SimConfig(speed=1000.0, max_model_len=LIMIT))) as engine,
        recorded_proxy(engine) as proxy,
    ):
        run = replay(proxy.url, session)

    assert all(step.error is None and step.status == 200 for step in run.steps)
    assert len(run.steps) >= 90
    assert max(step.prompt_tokens or 0 for step in run.steps) <= HIGH
    events = [step for step in run.steps if step.compaction]
    assert len(events) >= 3 and {step.compaction for step in events} <= {"summary", "elide"}
    assert proxy.total("prefill_proxy_compactions_total") == len(events)
    assert proxy.total("prefill_proxy_summaries_total") >= 1
    # Events decided after a reply (its summary ready) had their prompt warmed at once.
    assert proxy.total("prefill_proxy_warmups_total", trigger="compaction", outcome="ok") >= 1

    between = [s for s in run.steps[1:] if not s.compaction]
    prompt = sum(s.prompt_tokens or 0 for s in between)
    assert sum(s.cached_tokens or 0 for s in between) / prompt > 0.9

    forwarded = proxy.forwarded
    assert len(forwarded) == len(run.steps)
    assert all(is_valid_conversation(body["messages"]) for body in forwarded)
    compacted = [b["messages"] for b in forwarded if len(b["messages"]) > 2]
    summarized = [m for m in compacted if str(m[2].get("content")).startswith(SUMMARY_HEADER)]
    assert summarized, "no forwarded request carried a summary"
    for messages in summarized:  # right after the pinned head: system prompt, first task
        assert plan.head_length(messages) == 2 and messages[2]["role"] == "user"


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/responses"])
def test_the_engines_overflow_error_reaches_the_client_and_is_counted(
    route: str, vllm_server: Any, start_proxy: Any
) -> None:
    """A prompt over real vLLM's context, with no history to compact (one huge message):
    the proxy forwards it as it is and vLLM's own 400 reaches the client; the proxy
    recognises vLLM's way of saying it (0.32: "This model's maximum context length is
    16384 tokens. However, your prompt contains at least 16385 input tokens ..." on chat,
    "... exceeds the max_model_len 16384" on Responses)."""
    proxy = start_proxy(vllm_server.base_url)
    words = " ".join(f"w{n}" for n in range(20_000))  # over the test model's 16k context
    if route == "/v1/responses":
        body: dict[str, Any] = {"model": vllm_server.model, "input": words}
    else:
        body = {"model": vllm_server.model, "messages": [{"role": "user", "content": words}]}
    response = httpx.post(proxy.url + route, json=body, timeout=120)
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    print("vLLM said:", message)
    assert proxy.sample("prefill_proxy_context_overflows_total") == 1
    assert proxy.sample("prefill_proxy_compaction_fallbacks_total", reason="too_long") == 1


def test_an_overflow_on_the_simulator_is_counted(start_proxy: Any) -> None:
    """The simulator refuses like vLLM does when max_tokens is given ('maximum context
    length is ...'): that is recognised too."""
    from proxy.sim.app import create_sim_app
    from proxy.sim.config import SimConfig

    with serve(create_sim_app(SimConfig(speed=1000.0, max_model_len=2048))) as engine:
        proxy = start_proxy(engine)
        words = " ".join(f"w{n}" for n in range(3_000))
        body = {"model": "sim-model", "messages": [{"role": "user", "content": words}]}
        response = httpx.post(proxy.url + "/v1/chat/completions", json=body, timeout=30)
    assert response.status_code == 400
    assert proxy.sample("prefill_proxy_context_overflows_total") == 1
    assert proxy.sample("prefill_proxy_compaction_fallbacks_total", reason="too_long") == 1


def test_a_long_responses_session_compacts_into_valid_items() -> None:
    """The same session on /v1/responses: compaction works on the chat view of the items
    and writes its stand-ins back as message items; every forwarded input is a valid
    conversation (each call's output after its call), with the summary right after the
    first task, and the engine accepts every one."""
    from proxy.responses import items
    from proxy.sim.app import create_sim_app
    from proxy.sim.config import SimConfig

    session = [traces.parse(record) for record in synthetic.generate(1, 7, steps=90)]

    async def go(url: str) -> Run:
        async with make_client(1, 60) as http:
            options = Options(model="sim-model", api="responses")
            return await Replayer(http, url, options).run(session)

    with (
        serve(create_sim_app(SimConfig(speed=1000.0, max_model_len=LIMIT))) as engine,
        recorded_proxy(engine) as proxy,
    ):
        run = asyncio.run(go(proxy.url))

    assert all(step.error is None and step.status == 200 for step in run.steps)
    assert max(step.prompt_tokens or 0 for step in run.steps) <= HIGH
    events = [step for step in run.steps if step.compaction]
    assert len(events) >= 3
    between = [s for s in run.steps[1:] if not s.compaction]
    prompt = sum(s.prompt_tokens or 0 for s in between)
    assert sum(s.cached_tokens or 0 for s in between) / prompt > 0.9
    summarized = 0
    for body in proxy.forwarded:
        assert all(items.SOURCE not in item for item in body["input"])
        messages = items.strip_sources(items.to_chat(body)["messages"])
        assert is_valid_conversation(messages)
        first = body["input"][1] if len(body["input"]) > 1 else {}
        if str(first.get("content")).startswith(SUMMARY_HEADER):
            assert first["type"] == "message" and first["role"] == "user"
            summarized += 1
    assert summarized, "no forwarded request carried a summary"
