"""Compaction's invariants over generated sessions (DESIGN.md invariants 1, 2 and 5).

A session is replayed request by request through the Compactor, with a context limit
small enough that it compacts often. Summaries come from a summarizer endpoint on
httpx.MockTransport (a summary's content is not what is tested here; tests/e2e run the
real simulator and vLLM), and hypothesis decides for each step whether the summary in
flight finishes before the next request, so the summary, late-summary and fallback paths
all run.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from unittest import mock

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from proxy import config, tokens
from proxy.compaction import Compactor, bounds, plan
from proxy.compaction.budget import PER_MESSAGE, Sizer
from proxy.exchange import Exchange
from proxy.metrics import Metrics
from proxy.rewrite.detector import VolatileDetector
from proxy.sessions import MemoryStore, SessionStore
from proxy.tracker import SessionTracker
from proxy.upstream import Upstream
from tests.support.conversations import is_valid_conversation
from tests.support.stores import CodecStore

LIMIT = 1200
tokens.provision()
SIZER = Sizer(tokens.counter())
SHORTEST_STAND_IN = SIZER.message(plan.marker())
words = st.lists(st.sampled_from(["alpha", "beta", "ZFA04Y", "$12.50", "order", "2024-05-21"]))
texts = words.map(" ".join)
long_texts = st.integers(0, 120).map(lambda n: " ".join(f"item{k} price {k}.99" for k in range(n)))


@st.composite
def sessions(draw: st.DrawFn) -> list[dict[str, Any]]:
    """System prompt, task, then turns of tool loops, all valid, ending in user/tool
    messages at each request point."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a booking agent. " * draw(st.integers(1, 20))},
        {"role": "user", "content": draw(texts) or "help"},
    ]
    for turn in range(draw(st.integers(3, 14))):
        for step in range(draw(st.integers(0, 3))):
            ids = [f"c{turn}_{step}_{k}" for k in range(draw(st.integers(1, 2)))]
            calls = [
                {"id": i, "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
                for i in ids
            ]
            messages.append({"role": "assistant", "content": None, "tool_calls": calls})
            messages += [
                {"role": "tool", "tool_call_id": i, "content": draw(long_texts)} for i in ids
            ]
        messages.append({"role": "assistant", "content": draw(texts) or "done"})
        messages.append({"role": "user", "content": draw(texts) or "next"})
    return messages


def summarizer_transport() -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/chat/completions"
        body = {"choices": [{"message": {"role": "assistant", "content": "They booked."}}]}
        return httpx.Response(200, content=json.dumps(body).encode())

    return httpx.MockTransport(answer)


def request_points(messages: list[dict[str, Any]]) -> list[int]:
    """Lengths at which the agent calls the model: after a user message or the last
    result of a tool call."""
    points = []
    for index, message in enumerate(messages):
        nxt = messages[index + 1] if index + 1 < len(messages) else None
        if message["role"] in ("user", "tool") and (nxt is None or nxt["role"] == "assistant"):
            points.append(index + 1)
    return points


async def replay(
    messages: list[dict[str, Any]],
    finish: list[bool],
    store: SessionStore | None = None,
    *,
    body_bytes: bool = False,
    engine_counts: bool = False,
    limit: int = LIMIT,
    sizer: Sizer = SIZER,
) -> list[list[Any]]:
    """The messages forwarded at each step, checked on the way. ``body_bytes``: each turn
    knows its body's size, so requests far below the watermarks are not counted.
    ``engine_counts``: each reply reports usage, an engine's count of the prompt (the
    estimate's own, so the ratio stays 1), which bounds the next request without counting."""
    forwarded: list[list[Any]] = []
    overrides = {"upstream": "http://engine", "context_limit": limit, "summary_wait": 0}
    settings_ = config.load({**overrides, "elide_min_tokens": 120}, environ={})
    metrics = Metrics(CollectorRegistry())
    upstream = Upstream(settings_, summarizer_transport())
    detector = VolatileDetector(())
    tracker = SessionTracker(store if store is not None else MemoryStore(10, 60), detector, metrics)
    compactor = Compactor(
        settings_, upstream, metrics, sizer=sizer, mask=detector.key, post=tracker.post
    )
    tracker.listeners = [compactor]
    high = int(limit * settings_.compaction_high)
    previous: list[Any] | None = None
    seen_too_long = 0.0
    for step, length in enumerate(request_points(messages)):
        client = messages[:length]
        request = {"model": "m", "messages": client}
        turn = await tracker.open({}, request)
        assert turn is not None
        if body_bytes:
            turn.body_bytes = len(json.dumps(request, separators=(",", ":")).encode())
        exchange = Exchange("/v1/chat/completions", "POST")
        out = (await compactor.apply(request, turn, exchange))["messages"]
        head = plan.head_length(client)
        newest = plan.newest_turn(client, head)

        assert is_valid_conversation(out)
        assert out[:head] == client[:head]  # the pinned head, verbatim
        assert out[len(out) - (length - newest) :] == client[newest:]  # the newest turn too
        assert len(out) <= len(client)
        too_long = metrics.registry.get_sample_value(
            "prefill_proxy_compaction_fallbacks_total", {"reason": "too_long"}
        )
        if too_long is not None and too_long > seen_too_long:
            # Head + newest turn over the limit: forwarded as sent, for the engine to refuse.
            seen_too_long = too_long
            assert out == client
        elif not exchange.compaction and previous is not None:
            assert out[: len(previous)] == previous  # between events: grows at its end only
        forwarded.append(out)
        sizes = [SIZER.message(m) for m in out]  # the test's own counts
        # Bounded: under the high watermark unless head + stand-in + newest turn is not.
        kept = len(out) - (length - newest)
        floor = sum(sizes[:head]) + SHORTEST_STAND_IN + sum(sizes[kept:])
        assert sum(sizes) <= high or floor > high
        previous = None if out is client else out
        # The turn is over: record it as the proxy would, then let the summary finish or not.
        tracker.forward(turn, {**request, "messages": out}, exchange, rewritten_messages=client)
        reply = (
            messages[length] if length < len(messages) else {"role": "assistant", "content": "ok"}
        )
        exchange.status, exchange.reply = 200, reply
        if engine_counts:
            prompt = sum(SIZER.message(m) for m in out)
            completion = SIZER.message(reply) - PER_MESSAGE
            exchange.usage = {"prompt_tokens": prompt, "completion_tokens": completion}
        await tracker.close(turn, exchange)
        running = compactor.summaries.running()
        if running and finish[step % len(finish)]:
            await asyncio.gather(*running, return_exceptions=True)
        await tracker.settled()  # what the summaries posted is in the record
    compactor.close()
    await upstream.aclose()
    return forwarded


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(sessions(), st.lists(st.booleans(), min_size=1, max_size=8))
def test_compaction_invariants(messages: list[dict[str, Any]], finish: list[bool]) -> None:
    first = asyncio.run(replay(messages, finish))
    # The same session, the same summaries at the same moments: the same requests; also
    # when the session's record lives only as bytes between requests (a shared store).
    assert asyncio.run(replay(messages, finish, CodecStore())) == first
    # Requests that cannot reach the soft watermark by their size are not counted: the
    # same requests go out (issue 16's shortcut against the full path).
    assert asyncio.run(replay(messages, finish, body_bytes=True)) == first
    # Nor are those the engine's count of the last exchange shows below it (against the
    # full path with the same counts reported: they calibrate the estimate).
    counted = asyncio.run(replay(messages, finish, engine_counts=True))
    assert asyncio.run(replay(messages, finish, body_bytes=True, engine_counts=True)) == counted
    roomy = asyncio.run(replay(messages, finish, limit=4 * LIMIT))  # where most are not
    assert asyncio.run(replay(messages, finish, body_bytes=True, limit=4 * LIMIT)) == roomy
    counted = asyncio.run(replay(messages, finish, engine_counts=True, limit=4 * LIMIT))
    shortcut = replay(messages, finish, body_bytes=True, engine_counts=True, limit=4 * LIMIT)
    assert asyncio.run(shortcut) == counted
    # The engine's bound tried first, as where many messages are restored: the same.
    with mock.patch.object(bounds, "FEW_REPLACED", -1):
        shortcut = replay(messages, finish, body_bytes=True, engine_counts=True, limit=4 * LIMIT)
        assert asyncio.run(shortcut) == counted


def test_the_engine_s_count_calibrates_against_the_messages_that_step_forwarded() -> None:
    """A step that compacts nothing ("nothing gained") forwards its view; the engine's
    count of it must be compared with that view's estimate, not with an earlier step's
    (which made the estimate 3x too high here, and the next request was cut far below
    the high watermark's need: found by hypothesis)."""

    def results(call: str, sizes: list[int]) -> list[dict[str, Any]]:
        calls = [
            {
                "id": f"{call}_{k}",
                "type": "function",
                "function": {"name": "lookup", "arguments": "{}"},
            }
            for k in range(len(sizes))
        ]
        items = [" ".join(f"item{k} price {k}.99" for k in range(n)) for n in sizes]
        return [
            {"role": "assistant", "content": None, "tool_calls": calls},
            *(
                {"role": "tool", "tool_call_id": c["id"], "content": t}
                for c, t in zip(calls, items, strict=True)
            ),
        ]

    done, next_ = {"role": "assistant", "content": "done"}, {"role": "user", "content": "next"}
    messages = [
        {"role": "system", "content": "You are a booking agent. " * 17},
        {"role": "user", "content": "help"},
        done,
        next_,
        *results("c1_0", [55]),
        done,
        next_,
        *results("c2_0", [27, 120]),
        *results("c2_1", [37]),
        done,
        next_,
    ]
    asyncio.run(replay(messages, [False], engine_counts=True))  # checks the bound each step


def test_sessions_far_below_the_watermarks_never_load_the_encoding() -> None:
    """A body's bytes, then the engine's count of the last exchange, bound every step of
    a session under a roomy limit: the 125 MB encoding is never built (tokens.Lazy); the
    same session under a tight limit needs counts, and gets them."""
    session = [
        {"role": "system", "content": "You are a booking agent."},
        {"role": "user", "content": "help"},
        *(m for turn in range(6) for m in _tool_round(f"c{turn}", 40)),
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "next"},
    ]
    roomy = tokens.Lazy()
    asyncio.run(
        replay(
            session,
            [True],
            body_bytes=True,
            engine_counts=True,
            limit=40 * LIMIT,
            sizer=Sizer(roomy),
        )
    )
    assert not roomy.loaded
    tight = tokens.Lazy()
    asyncio.run(replay(session, [True], body_bytes=True, engine_counts=True, sizer=Sizer(tight)))
    assert tight.loaded


def _tool_round(call: str, rows: int) -> list[dict[str, Any]]:
    function = {"name": "lookup", "arguments": "{}"}
    content = " ".join(f"item{k} price {k}.99" for k in range(rows))
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call, "type": "function", "function": function}],
        },
        {"role": "tool", "tool_call_id": call, "content": content},
    ]
