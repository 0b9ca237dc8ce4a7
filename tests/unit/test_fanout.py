"""Fan-out holds: the prefix key, and the gate on a real event loop with real exchanges
(leaders released at the first token or at the end, followers released or timed out)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from proxy.exchange import Exchange, Recorder
from proxy.fanout import FanoutGate, prefix_key
from proxy.metrics import Metrics
from tests.support.clock import Clock

TOOLS = [{"type": "function", "function": {"name": "search", "description": "d" * 2000}}]
SYSTEM = {"role": "system", "content": "You are a research sub-agent. " * 200}  # ~1.5k tokens
CONTEXT = {"role": "user", "content": "Shared context: the repository layout."}


def task(n: int) -> dict[str, Any]:
    return {"role": "user", "content": f"Task {n}: look into module {n}."}


def body(last: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": "m", "tools": TOOLS, "messages": [SYSTEM, CONTEXT, last], **fields}


# --- the key ---------------------------------------------------------------------------


def test_sub_agents_with_different_tasks_share_a_key() -> None:
    key = prefix_key(body(task(1)), 1000)
    assert key is not None and len(key) == 16
    assert prefix_key(body(task(2)), 1000) == key
    assert prefix_key(body(task(1), stream=True, max_tokens=5), 1000) == key  # sampling aside


@pytest.mark.parametrize(
    "other",
    [
        body(task(1), model="other"),
        body(task(1), tools=[*TOOLS, {"type": "function", "function": {"name": "x"}}]),
        body(task(1), chat_template_kwargs={"enable_thinking": False}),
        body(task(1), cache_salt="tenant-2"),
        {**body(task(1)), "messages": [{**SYSTEM, "content": "Other. " * 800}, CONTEXT, task(1)]},
        {**body(task(1)), "messages": [SYSTEM, task(9), task(1)]},
    ],
    ids=["model", "tools", "template-kwargs", "cache-salt", "system", "context"],
)
def test_anything_rendered_before_the_newest_message_changes_the_key(other: Any) -> None:
    assert prefix_key(other, 1000) != prefix_key(body(task(1)), 1000)


def test_short_heads_and_odd_requests_have_no_key() -> None:
    short = {"model": "m", "messages": [{"role": "system", "content": "Hi"}, task(1)]}
    assert prefix_key(short, 1000) is None
    assert prefix_key(short, 1) is not None
    assert prefix_key({"model": "m", "messages": []}, 0) is None
    assert prefix_key({"model": "m", "messages": "hi"}, 0) is None
    assert prefix_key({"model": "m"}, 0) is None
    # One message and long tools: the tools alone are a shared prefix.
    assert prefix_key({"model": "m", "tools": TOOLS, "messages": [task(1)]}, 400) is not None


# --- the gate --------------------------------------------------------------------------


class Harness:
    def __init__(self, hold: float = 30.0, **options: Any) -> None:
        self.registry = CollectorRegistry()
        self.metrics = Metrics(self.registry)
        self.clock = Clock()
        self.gate = FanoutGate(hold, 1000, self.metrics, clock=self.clock, **options)
        self.recorder = Recorder(self.metrics)

    def exchange(self, prefix_break: str = "new_session") -> Exchange:
        exchange = self.recorder.begin("/v1/chat/completions", "POST")
        exchange.prefix_break = prefix_break
        return exchange

    def holds(self, outcome: str) -> float:
        labels = {"outcome": outcome}
        return self.registry.get_sample_value("prefill_proxy_fanout_holds_total", labels) or 0.0

    def hold_time(self) -> tuple[float, float]:
        count = self.registry.get_sample_value("prefill_proxy_fanout_hold_seconds_count")
        total = self.registry.get_sample_value("prefill_proxy_fanout_hold_seconds_sum")
        return count or 0.0, total or 0.0

    async def follow(self, *bodies: dict[str, Any]) -> list[tuple[asyncio.Task[None], Exchange]]:
        """Admit each body as its own request; return once each runs or waits."""
        started = []
        for request in bodies:
            exchange = self.exchange()
            task = asyncio.get_running_loop().create_task(self.gate.admit(request, exchange))
            started.append((task, exchange))
        await settle()
        return started


async def settle() -> None:
    """Let every ready task run until it blocks (no time passes)."""
    for _ in range(20):
        await asyncio.sleep(0)


@pytest.mark.anyio
async def test_followers_wait_for_the_leaders_first_token() -> None:
    h = Harness()
    leader = h.exchange()
    await h.gate.admit(body(task(0)), leader)  # the first goes at once
    assert h.gate.leaders == 1
    followers = await h.follow(body(task(1)), body(task(2)), body(task(3)))
    assert not any(t.done() for t, _ in followers)
    h.clock.now += 0.25
    leader.mark_token(h.clock.now)
    await settle()
    assert all(t.done() and t.exception() is None for t, _ in followers)
    assert [e.held_s for _, e in followers] == [0.25, 0.25, 0.25]
    assert h.holds("released") == 3 and h.holds("timeout") == 0
    assert h.hold_time() == (3, 0.75)
    assert h.gate.leaders == 0 and leader.held_s == 0.0


@pytest.mark.anyio
async def test_once_cached_the_prefix_is_not_held_until_the_mark_expires() -> None:
    h = Harness(cached_ttl=60.0)
    leader = h.exchange()
    await h.gate.admit(body(task(0)), leader)
    leader.mark_token(h.clock.now)
    h.clock.now += 59
    [(late, _)] = await h.follow(body(task(1)))
    assert late.done() and h.gate.leaders == 0  # neither held nor leading
    h.clock.now += 2
    await h.gate.admit(body(task(2)), h.exchange())  # the mark expired: it leads again
    assert h.gate.leaders == 1 and h.holds("released") == 0


@pytest.mark.anyio
async def test_a_follower_goes_anyway_when_the_hold_runs_out() -> None:
    h = Harness(hold=0.02)
    h.gate._clock = asyncio.get_running_loop().time  # real time: the hold must elapse
    leader = h.exchange()
    await h.gate.admit(body(task(0)), leader)
    exchange = h.exchange()
    await h.gate.admit(body(task(1)), exchange)  # returns once the hold is over
    assert h.holds("timeout") == 1 and h.holds("released") == 0
    assert 0.02 <= exchange.held_s < 1.0
    assert h.gate.leaders == 1  # the leader is still in flight; nothing else registered
    leader.mark_token(0.0)
    assert h.gate.leaders == 0


@pytest.mark.anyio
async def test_a_failed_leader_hands_over_to_its_first_follower() -> None:
    h = Harness()
    leader = h.exchange()
    await h.gate.admit(body(task(0)), leader)
    followers = await h.follow(body(task(1)), body(task(2)), body(task(3)))
    leader.status = 503
    h.recorder.finish(leader)  # the exchange ends without a token: nothing was cached
    await settle()
    (first, successor), *rest = followers
    assert first.done() and h.gate.leaders == 1  # the first follower leads now
    assert not any(t.done() for t, _ in rest)
    h.clock.now += 1.0
    successor.mark_token(h.clock.now)
    await settle()
    assert all(t.done() for t, _ in rest)
    assert h.holds("released") == 3 and h.holds("timeout") == 0
    assert h.gate.leaders == 0


@pytest.mark.anyio
async def test_a_leader_whose_client_left_caches_nothing() -> None:
    h = Harness()
    leader = h.exchange()
    leader.stream, leader.status = True, 200
    await h.gate.admit(body(task(0)), leader)
    leader.client_disconnected = True
    h.recorder.finish(leader)
    await h.gate.admit(body(task(1)), h.exchange())  # not cached: it leads
    assert h.gate.leaders == 1 and h.holds("released") == 0


@pytest.mark.anyio
async def test_a_non_streamed_leader_releases_at_its_end() -> None:
    h = Harness()
    leader = h.exchange()
    await h.gate.admit(body(task(0)), leader)
    [(follower, _)] = await h.follow(body(task(1)))
    leader.status = 200
    h.recorder.finish(leader)  # a whole reply: the prefix is cached
    await settle()
    assert follower.done() and h.holds("released") == 1
    [(late, _)] = await h.follow(body(task(2)))
    assert late.done() and h.gate.leaders == 0  # the key is known cached


@pytest.mark.anyio
async def test_a_cancelled_follower_leaves_nothing_behind() -> None:
    h = Harness()
    leader = h.exchange()
    await h.gate.admit(body(task(0)), leader)
    [(gone, _), (staying, _)] = await h.follow(body(task(1)), body(task(2)))
    gone.cancel()
    await settle()
    assert gone.cancelled() and not staying.done()
    leader.mark_token(h.clock.now)
    await settle()
    assert staying.done() and h.gate.leaders == 0
    assert h.holds("released") == 1  # the cancelled one is not counted


@pytest.mark.anyio
async def test_continuing_sessions_and_the_same_request_are_never_held() -> None:
    h = Harness()
    leader = h.exchange()
    await h.gate.admit(body(task(0)), leader)
    stepping = h.exchange(prefix_break="none")
    await h.gate.admit(body(task(1)), stepping)  # its own previous step cached the prefix
    await h.gate.admit(body(task(0)), leader)  # never behind itself
    assert h.holds("released") + h.holds("timeout") == 0
    assert stepping.on_first_token == [] and len(leader.on_first_token) == 1


@pytest.mark.anyio
async def test_tables_are_bounded_in_size_and_age() -> None:
    h = Harness(hold=1.0, max_keys=2, cached_ttl=5.0)
    leaders = []
    for n in range(3):
        other = copy.deepcopy(body(task(0)))
        other["messages"][1]["content"] += str(n)
        exchange = h.exchange()
        await h.gate.admit(other, exchange)
        leaders.append(exchange)
    assert h.gate.leaders == 2  # the third goes unregistered
    assert leaders[2].on_first_token == []
    # A leader whose exchange never ends is forgotten after a while.
    h.clock.now += 60.0
    await h.gate.admit(body(task(9)), h.exchange())
    assert h.gate.leaders == 1
    assert h.gate._leader_ttl == 60.0


@pytest.mark.anyio
async def test_a_lost_leader_is_forgotten_and_its_followers_go() -> None:
    h = Harness(hold=1.0)  # leaders are presumed lost after max(60 s, 10 holds)
    lost = h.exchange()  # its exchange never ends (a bug elsewhere)
    await h.gate.admit(body(task(0)), lost)
    [(follower, exchange)] = await h.follow(body(task(1)))
    h.clock.now += 61.0  # past the leader's age limit (and the follower's hold)
    newcomer = h.exchange()
    await h.gate.admit(body(task(2)), newcomer)  # expires the lost leader, leads itself
    await settle()
    assert follower.done() and exchange.held_s == 61.0
    assert h.holds("timeout") == 1
    assert h.gate.leaders == 1 and len(newcomer.on_first_token) == 1
