"""Round-trip metrics: tool calls per step and steps per user turn, observed after each
recorded reply (through the session tracker, as the proxy calls it)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from proxy.batching import RoundTrips, steps_in_turn, tool_call_count
from proxy.exchange import Exchange
from proxy.metrics import Metrics
from proxy.rewrite.detector import VolatileDetector
from proxy.sessions import MemoryStore
from proxy.tracker import SessionTracker

SYSTEM = {"role": "system", "content": "You book flights."}
USER = {"role": "user", "content": "Book me to Paris."}


def call(n: int) -> dict[str, Any]:
    return {"id": f"c{n}", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def calls(*ids: int) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [call(i) for i in ids]}


def result(n: int) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": f"c{n}", "content": "done"}


ANSWER = {"role": "assistant", "content": "Booked."}


@pytest.mark.parametrize(
    ("messages", "steps"),
    [
        ([SYSTEM, USER], 1),
        ([SYSTEM, USER, calls(1), result(1)], 2),
        ([SYSTEM, USER, calls(1, 2), result(1), result(2), calls(3), result(3)], 3),
        # an earlier turn's steps do not count
        ([SYSTEM, USER, calls(1), result(1), ANSWER, USER], 1),
        ([SYSTEM, USER, calls(1), result(1), ANSWER, USER, calls(2), result(2)], 2),
        ([SYSTEM], 1),
        ([calls(1), result(1)], 2),  # no user message at all: from the start
        ([USER, "junk", None, calls(1)], 2),
    ],
)
def test_steps_in_turn(messages: list[Any], steps: int) -> None:
    assert steps_in_turn(messages) == steps


@pytest.mark.parametrize(
    ("reply", "count"),
    [(calls(1, 2, 3), 3), (ANSWER, 0), (None, 0), ({"tool_calls": None}, 0), ("x", 0)],
)
def test_tool_call_count(reply: Any, count: int) -> None:
    assert tool_call_count(reply) == count


class Tracked:
    """The session tracker with RoundTrips as its listener, on a fresh registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        metrics = Metrics(self.registry)
        self.tracker = SessionTracker(
            MemoryStore(10, 60), VolatileDetector(), metrics, [RoundTrips(metrics)]
        )

    def step(self, messages: list[Any], reply: dict[str, Any], status: int = 200) -> None:
        request = {"model": "m", "messages": messages}
        turn = asyncio.run(self.tracker.open({}, request))
        assert turn is not None
        exchange = Exchange("/v1/chat/completions", "POST", status=status)
        self.tracker.forward(turn, request, exchange)
        exchange.reply = reply
        asyncio.run(self.tracker.close(turn, exchange))

    def histogram(self, name: str) -> tuple[float, float]:
        count = self.registry.get_sample_value(f"prefill_proxy_{name}_count") or 0.0
        total = self.registry.get_sample_value(f"prefill_proxy_{name}_sum") or 0.0
        return count, total


def test_an_agent_loop_is_measured_step_by_step() -> None:
    proxy = Tracked()
    history = [SYSTEM, USER]
    proxy.step(history, calls(1, 2))  # two lookups at once
    history += [calls(1, 2), result(1), result(2)]
    proxy.step(history, calls(3))
    history += [calls(3), result(3)]
    proxy.step(history, ANSWER)  # the turn ends after three model calls
    assert proxy.histogram("tool_calls_per_step") == (2, 3)
    assert proxy.histogram("steps_per_user_turn") == (1, 3)
    history += [ANSWER, {"role": "user", "content": "Thanks!"}]
    proxy.step(history, {"role": "assistant", "content": "You're welcome."})
    assert proxy.histogram("steps_per_user_turn") == (2, 4)


def test_failed_replies_are_not_counted() -> None:
    proxy = Tracked()
    proxy.step([SYSTEM, USER], calls(1), status=503)
    proxy.step([SYSTEM, USER], ANSWER, status=500)
    assert proxy.histogram("tool_calls_per_step") == (0, 0)
    assert proxy.histogram("steps_per_user_turn") == (0, 0)
