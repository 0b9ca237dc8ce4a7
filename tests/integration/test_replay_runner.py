"""The replay runner in process, over httpx.MockTransport: concurrency, tool pauses, order."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from proxy.replay import synthetic, traces
from proxy.replay.runner import Options, Replayer
from tests.support.fake_upstream import WORDS, stream_events

pytestmark = pytest.mark.anyio

CONVERSATIONS = synthetic.conversations(6, seed=3)
STEPS = [s for c in CONVERSATIONS for s in traces.steps(c)]


class Engine:
    """Answers every chat request with the fake stream; counts requests in flight."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.most_in_flight = 0
        self.bodies: list[dict] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        for _ in range(5):  # let every other worker reach its request first
            await asyncio.sleep(0)
        self.in_flight -= 1
        self.bodies.append(json.loads(request.content))
        return httpx.Response(200, content=b"".join(stream_events(include_usage=True)))


async def replay(engine: Engine, **options: object) -> tuple[list, list[float]]:
    pauses: list[float] = []

    async def pause(seconds: float) -> None:
        pauses.append(seconds)

    async with httpx.AsyncClient(transport=httpx.MockTransport(engine)) as client:
        settings = Options(model="m", **options)  # type: ignore[arg-type]
        replayer = Replayer(client, "http://engine", settings, sleep=pause)
        run = await replayer.run(CONVERSATIONS)
    return run.steps, pauses


@pytest.mark.parametrize("concurrency", [1, 4, 64])
async def test_conversations_in_flight_and_records_in_order(concurrency: int) -> None:
    engine = Engine()
    records, _ = await replay(engine, concurrency=concurrency)
    assert engine.most_in_flight == min(concurrency, len(CONVERSATIONS))
    assert [(r.conversation, r.step) for r in records] == [
        (s.conversation.id, s.index) for s in STEPS
    ]
    # Within a conversation, steps reach the engine one after another, in order.
    step_of = {json.dumps([s.messages, s.reply]): s for s in STEPS}
    received: dict[str, list[int]] = {}
    for body in engine.bodies:
        step = step_of[json.dumps([body["messages"], body["x_replay_reply"]])]
        received.setdefault(step.conversation.id, []).append(step.index)
    assert all(indices == list(range(len(indices))) for indices in received.values())
    assert sum(map(len, received.values())) == len(STEPS)


async def test_tool_latency_pauses_before_steps_that_follow_tool_results() -> None:
    _, pauses = await replay(Engine(), tool_latency=0.25)
    assert pauses == [0.25] * sum(step.after_tool for step in STEPS)
    _, none = await replay(Engine())
    assert none == []


async def test_varied_tool_rounds_are_drawn_per_step_and_the_same_in_every_run() -> None:
    _, first = await replay(Engine(), tool_latency=0.5, tool_latency_max=10.0)
    _, again = await replay(Engine(), tool_latency=0.5, tool_latency_max=10.0)
    assert sorted(first) == sorted(again) and len(first) == sum(s.after_tool for s in STEPS)
    assert all(0.5 <= pause <= 10.0 for pause in first) and len(set(first)) == len(first)


async def test_a_start_spread_delays_each_worker_by_its_share() -> None:
    _, pauses = await replay(Engine(), concurrency=4, start_spread=2.0)
    assert sorted(pauses)[:3] == [0.5, 1.0, 1.5]  # workers 1-3; worker 0 starts at once
    assert len(pauses) == 3  # no tool latency: nothing else pauses


async def test_echoed_replies_replace_the_recorded_ones_in_later_steps() -> None:
    engine = Engine()
    await replay(engine, echo_replies=True)
    emitted = {"role": "assistant", "content": "".join(WORDS)}  # what the engine streamed
    conversation = CONVERSATIONS[0]
    first, *later = [s for s in STEPS if s.conversation is conversation]
    bodies = engine.bodies[: len(later) + 1]  # concurrency 1: this conversation's steps
    for step, body in zip(later, bodies[1:], strict=True):
        history = conversation.messages[: step.position]
        replies = [k for k, m in enumerate(history) if m["role"] == "assistant"]
        assert [body["messages"][k] for k in replies] == [emitted] * len(replies)
        others = [m for k, m in enumerate(body["messages"]) if k not in replies]
        assert others == [m for k, m in enumerate(step.messages) if k not in replies]
    assert bodies[0]["messages"] == first.messages
    plain = Engine()
    await replay(plain)
    assert plain.bodies[1]["messages"] == later[0].messages  # without: the trace's replies


async def test_the_compaction_header_is_recorded_per_step() -> None:
    compacted = {1: "summary", 4: "elide"}  # request number -> the proxy's header
    count = 0

    async def proxy(request: httpx.Request) -> httpx.Response:
        nonlocal count
        kind, count = compacted.get(count), count + 1
        headers = {"x-prefill-proxy-overhead-ms": "0.75"}
        if kind:
            headers["x-prefill-proxy-compaction"] = kind
        body = b"".join(stream_events(include_usage=True))
        return httpx.Response(200, content=body, headers=headers)

    async with httpx.AsyncClient(transport=httpx.MockTransport(proxy)) as client:
        run = await Replayer(client, "http://proxy", Options(model="m")).run(CONVERSATIONS[:1])
    assert {k: r.compaction for k, r in enumerate(run.steps) if r.compaction} == compacted
    assert {r.proxy_overhead_ms for r in run.steps} == {0.75}


async def test_client_trim_budget_reaches_the_requests() -> None:
    engine = Engine()
    await replay(engine, profile="client-trim", trim_tokens=1)
    assert all(len(body["messages"]) == 1 for body in engine.bodies)  # the system prompt
    engine = Engine()
    await replay(engine, profile="client-trim")  # the default budget keeps these whole
    assert max(len(body["messages"]) for body in engine.bodies) > 10
