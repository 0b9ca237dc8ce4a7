"""Summaries written in the background (proxy.compaction.summaries): one per session, still
good only for the conversation it covers, waited for within summary_wait, and a failure
posted to the session's record, which then pauses the next try."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from prometheus_client import CollectorRegistry

from proxy import config
from proxy.compaction.planner import SummaryAsk
from proxy.compaction.summaries import RETRY_S, Summaries
from proxy.metrics import Metrics
from proxy.sessions import Session
from proxy.upstream import Upstream
from tests.support.clock import Clock

ASK = SummaryAsk({"model": "m", "messages": []}, b"k3", 4, ["ABC123"])


class Engine:
    """The summarizer: answers once released (or fails)."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.release = asyncio.Event()
        self.calls = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        await self.release.wait()
        body = {"choices": [{"message": {"role": "assistant", "content": "So far: X."}}]}
        return httpx.Response(self.status, content=json.dumps(body).encode())


class Harness:
    def __init__(self, engine: Engine, **overrides: object) -> None:
        settings = config.load({"upstream": "http://engine", **overrides}, environ={})
        self.registry = CollectorRegistry()
        self.posted: list[tuple[str, object]] = []
        self.clock = Clock(1000.0)
        self.summaries = Summaries(
            settings,
            Upstream(settings, httpx.MockTransport(engine)),
            Metrics(self.registry),
            post=lambda key, change: self.posted.append((key, change)),
            clock=self.clock,
        )

    def outcomes(self, outcome: str) -> float:
        return (
            self.registry.get_sample_value("prefill_proxy_summaries_total", {"outcome": outcome})
            or 0
        )


@pytest.mark.anyio
async def test_a_summary_waited_for_is_late_and_its_result_covers_the_cut() -> None:
    engine = Engine()
    h = Harness(engine, summary_wait=5)
    pending = h.summaries.start("s", ASK, (), base=None)
    assert h.summaries.valid("s", None, [b"k0", b"k1", b"k2", b"k3", b"k4"]) is pending
    asyncio.get_running_loop().call_later(0.05, engine.release.set)
    assert await h.summaries.wait("s", pending) == "late"
    summary = pending.result()
    assert (summary.text, summary.cut_key, summary.cut_index) == ("So far: X.", b"k3", 4)
    assert summary.facts == ["ABC123"] and h.outcomes("late") == 1


@pytest.mark.anyio
async def test_a_summary_not_ready_in_time_is_missing_and_keeps_running() -> None:
    engine = Engine()
    h = Harness(engine, summary_wait=0.01)
    pending = h.summaries.start("s", ASK, (), base=None)
    assert await h.summaries.wait("s", pending) == "missing"
    assert not pending.task.done() and h.summaries.get("s") is pending
    engine.release.set()
    await pending.task
    assert await h.summaries.wait("s", pending) == "on_time"  # ready for the next event


@pytest.mark.anyio
async def test_a_summary_for_another_conversation_is_dropped() -> None:
    h = Harness(Engine())
    pending = h.summaries.start("s", ASK, (), base=None)
    assert h.summaries.valid("s", None, [b"k0", b"other"]) is None  # the client rewrote it
    await asyncio.sleep(0)
    assert pending.task.cancelled() and h.summaries.get("s") is None
    pending = h.summaries.start("s", ASK, (), base=None)
    assert h.summaries.valid("s", b"another base", [b"k0", b"k1", b"k2", b"k3"]) is None


@pytest.mark.anyio
async def test_a_failure_goes_to_the_record_and_pauses_the_next_try() -> None:
    engine = Engine(status=500)
    engine.release.set()
    h = Harness(engine)
    pending = h.summaries.start("s", ASK, (), base=None)
    assert await h.summaries.wait("s", pending) == "failed"
    ((key, change),) = h.posted
    session = Session("s")
    change(session)  # what the tracker does when the session is next opened
    assert key == "s" and session.summary_failed_at == 1000.0
    assert not h.summaries.may_start(session)
    h.clock.now += RETRY_S
    assert h.summaries.may_start(session)


@pytest.mark.anyio
async def test_settling_on_a_new_cut_cancels_a_summary_that_does_not_extend_it() -> None:
    h = Harness(Engine())
    pending = h.summaries.start("s", ASK, (), base=None)
    h.summaries.settled("s", b"elsewhere")
    await asyncio.sleep(0)
    assert pending.task.cancelled() and h.summaries.running() == []


@pytest.mark.anyio
async def test_a_summary_cancelled_while_waited_for_is_failed_for_the_waiter() -> None:
    """Two conversations sharing a head: one waits for the summary that the other's event
    makes useless and cancels. The waiter falls back; it does not get the cancellation."""
    h = Harness(Engine(), summary_wait=5)
    pending = h.summaries.start("s", ASK, (), base=None)
    waiter = asyncio.create_task(h.summaries.wait("s", pending))
    await asyncio.sleep(0.01)
    h.summaries.settled("s", b"elsewhere")
    assert await waiter == "failed" and h.outcomes("failed") == 1
