"""The shared session store against a real valkey-server: compare and set between
replicas, bounds (TTL, count, bytes), and failing open when the store is down, slow or
restarted empty."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from proxy.exchange import Exchange
from proxy.metrics import Metrics
from proxy.redis_store import RedisStore, StoreUnavailable, describe
from proxy.rewrite.detector import VolatileDetector
from proxy.sessions import Session
from proxy.tracker import SessionTracker
from tests.support.clock import Clock
from tests.support.valkey import Valkey, running

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def valkey() -> Iterator[Valkey]:
    with running() as server:
        yield server


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(CollectorRegistry())


def store_on(server: Valkey, metrics: Metrics, **options: Any) -> RedisStore:
    settings: dict[str, Any] = {
        "ttl_s": 60,
        "max_sessions": 1000,
        "max_bytes": 1 << 20,
        "timeout": 0.5,
        **options,
    }
    return RedisStore(server.url, metrics, **settings)


def fallbacks(metrics: Metrics, reason: str) -> float:
    value = metrics.registry.get_sample_value(
        "prefill_proxy_session_store_fallbacks_total", {"reason": reason}
    )
    return value or 0.0


def errors(metrics: Metrics, kind: str) -> float:
    value = metrics.registry.get_sample_value(
        "prefill_proxy_session_store_errors_total", {"kind": kind}
    )
    return value or 0.0


async def test_a_record_round_trips_and_saves_compare_and_set(
    valkey: Valkey, metrics: Metrics
) -> None:
    a, b = store_on(valkey, metrics), store_on(valkey, metrics)  # two replicas
    try:
        session = Session("round-trip")
        session.substitute(b"k1", {"role": "assistant", "content": "as emitted"})
        session.engine = "http://engine-2:8000"
        assert await a.save(session) and session.version == 1
        first, second = await a.get("round-trip"), await b.get("round-trip")
        assert first is not None and second is not None
        assert first == second == session  # every field survives, the version too
        first.substitute(b"k2", {"role": "assistant", "content": "first"})
        assert await a.save(first) and first.version == 2
        second.substitute(b"k3", {"role": "assistant", "content": "second"})
        assert not await b.save(second)  # loaded before first's save: it would undo it
        current = await b.get("round-trip")
        assert current is not None and list(current.substitutions) == [b"k1", b"k2"]
        await b.delete("round-trip")
        assert await a.get("round-trip") is None
    finally:
        await a.aclose()
        await b.aclose()


async def test_concurrent_writers_on_one_session_lose_nothing(
    valkey: Valkey, metrics: Metrics
) -> None:
    """Eight replicas add one message each to the same record at once, retrying on a
    conflict as the tracker does: all eight are in the record, none twice."""
    stores = [store_on(valkey, metrics) for _ in range(8)]
    await stores[0].save(Session("crowded"))

    async def add(store: RedisStore, index: int) -> int:
        for attempt in range(100):
            session = await store.get("crowded")
            assert session is not None
            session.substitute(bytes([index]), {"n": index})
            await asyncio.sleep(0)  # let the others load the same version
            if await store.save(session):
                return attempt
        raise AssertionError("never saved")

    try:
        retries = await asyncio.gather(*(add(s, i) for i, s in enumerate(stores)))
        final = await stores[0].get("crowded")
        assert final is not None
        assert sorted(final.substitutions) == [bytes([i]) for i in range(8)]
        assert final.version == 1 + 8
        assert sum(retries) > 0  # they did collide
    finally:
        for store in stores:
            await store.aclose()


async def test_two_trackers_on_one_store_keep_both_replies(
    valkey: Valkey, metrics: Metrics
) -> None:
    """Two proxy replicas, one request each of the same session in flight together (two
    sub-agents sharing a head): both replies are in the shared record."""
    replicas = [
        SessionTracker(store_on(valkey, metrics), VolatileDetector(), metrics) for _ in range(2)
    ]
    system = {"role": "system", "content": "You are a travel agent (two replicas)."}
    user = {"role": "user", "content": "Book me a flight."}
    replies = [
        {"role": "assistant", "content": "To where?"},
        {"role": "assistant", "content": "Which date?"},
    ]
    turns = []
    for tracker in replicas:
        request = {"model": "m", "messages": [system, user]}
        turn = await tracker.open({}, request)
        assert turn is not None
        turns.append((tracker, turn, request))
    for (tracker, turn, request), reply in zip(turns, replies, strict=True):
        exchange = Exchange("/v1/chat/completions", "POST", status=200, reply=reply)
        tracker.forward(turn, request, exchange)
        await tracker.close(turn, exchange)
    stored = await replicas[0].store.get(turns[0][1].session.key)
    assert stored is not None and stored.version == 2
    kept = [m for m in stored.substitutions.values() if m.get("role") == "assistant"]
    assert replies[0] in kept and replies[1] in kept
    assert metrics.registry.get_sample_value("prefill_proxy_session_conflicts_total") == 1
    for tracker in replicas:
        await tracker.aclose()


async def test_records_are_bounded_by_count_ttl_and_bytes(valkey: Valkey, metrics: Metrics) -> None:
    store = store_on(valkey, metrics, max_sessions=3, max_bytes=4096)
    try:
        for index in range(5):
            assert await store.save(Session(f"bounded-{index}"))
        assert store.held() == 3
        assert await store.get("bounded-0") is None  # least recently saved went first
        assert await store.get("bounded-4") is not None
        big = Session("bounded-big")
        for index in range(40):
            big.substitute(bytes([index]), {"role": "assistant", "content": "x" * 200})
        assert await store.save(big)
        kept = await store.get("bounded-big")
        assert kept is not None and 0 < len(kept.substitutions) < 40
        assert bytes([39]) in kept.substitutions  # the newest stay, the oldest went
        assert errors(metrics, "too_large") == 1
    finally:
        await store.aclose()
    short = store_on(valkey, metrics, ttl_s=0.05)
    try:
        assert await short.save(Session("short-lived"))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while await short.get("short-lived") is not None:  # Redis expires it, not us
            assert loop.time() < deadline, "not expired"
            await asyncio.sleep(0.05)
    finally:
        await short.aclose()


async def test_a_long_client_session_id_is_hashed_into_the_key(
    valkey: Valkey, metrics: Metrics
) -> None:
    store = store_on(valkey, metrics)
    try:
        key = "h:" + "x" * 5000
        assert await store.save(Session(key))
        stored = await store.get(key)
        assert stored is not None and stored.key == key
    finally:
        await store.aclose()


async def test_a_store_down_fails_fast_and_comes_back_by_itself(metrics: Metrics) -> None:
    server = Valkey()
    server.start()
    clock = Clock(0.0)
    store = store_on(server, metrics, timeout=0.3, clock=clock)
    try:
        survivor = Session("survivor")
        survivor.substitute(b"k", {"role": "assistant", "content": "as emitted"})
        assert await store.save(survivor)
        server.kill()
        with pytest.raises(StoreUnavailable):  # a record this replica never saw
            await store.get("stranger")
        assert errors(metrics, "connection") + errors(metrics, "timeout") == 1
        with pytest.raises(StoreUnavailable):  # skipped: no wait on a store known down
            await store.get("stranger")
        assert errors(metrics, "skipped") == 1
        near = await store.get("survivor")  # the replica's own copy serves meanwhile
        assert near is not None and list(near.substitutions) == [b"k"]
        assert fallbacks(metrics, "down") == 1
        server.start()  # restarted empty, same port
        clock.now += 1.5
        lost = await store.get("survivor")  # the store has none: the near copy, as new
        assert lost is not None and lost.version == 0 and list(lost.substitutions) == [b"k"]
        assert fallbacks(metrics, "lost") == 1
        assert await store.save(lost) and lost.version == 1  # created again
        again = await store_on(server, metrics).get("survivor")  # another replica sees it
        assert again is not None and list(again.substitutions) == [b"k"]
    finally:
        await store.aclose()
        server.stop()


async def test_a_near_copy_loses_to_a_record_another_replica_created(metrics: Metrics) -> None:
    server = Valkey()
    server.start()
    clock = Clock(0.0)
    mine, theirs = store_on(server, metrics, clock=clock), store_on(server, metrics)
    try:
        assert await mine.save(Session("shared"))
        server.restart()  # empty
        await mine.ping()  # the pooled connection was to the old server: it fails once
        clock.now += 1.5
        stale = await mine.get("shared")
        assert stale is not None and stale.version == 0
        fresh = Session("shared")
        fresh.substitute(b"theirs", {"role": "assistant", "content": "newer"})
        assert await theirs.save(fresh)
        assert not await mine.save(stale)  # compare and set: theirs came first
        current = await mine.get("shared")
        assert current is not None and list(current.substitutions) == [b"theirs"]
    finally:
        await mine.aclose()
        await theirs.aclose()
        server.stop()


async def test_a_tracker_on_a_dead_store_serves_without_sessions(metrics: Metrics) -> None:
    server = Valkey()
    server.start()
    tracker = SessionTracker(store_on(server, metrics, timeout=0.3), VolatileDetector(), metrics)
    server.kill()
    try:
        request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        assert await tracker.open({}, request) is None  # the request goes on, sessionless
        assert metrics.registry.get_sample_value("prefill_proxy_session_errors_total") == 1
    finally:
        await tracker.aclose()
        server.stop()


def test_the_log_never_shows_the_password() -> None:
    assert describe("redis://:s3cret@redis.internal:6379/0") == "redis://***@redis.internal:6379/0"
    assert describe("unix:///run/redis.sock") == "unix:///run/redis.sock"


async def test_a_restarted_store_is_used_after_one_pause_whatever_the_pool_held(
    metrics: Metrics,
) -> None:
    """Many pooled connections to the old server: one failure drops them all, so the
    first call after the pause reaches the restarted store."""
    server = Valkey()
    server.start()
    clock = Clock(0.0)
    store = store_on(server, metrics, timeout=0.5, clock=clock)
    try:
        await asyncio.gather(*(store.get(f"warm-{index}") for index in range(8)))  # 8 in the pool
        server.restart()
        with pytest.raises(StoreUnavailable):
            await store.get("stranger")
        clock.now += 1.5
        assert await store.get("stranger") is None  # answered, by the new server
        assert await store.save(Session("after-restart"))
    finally:
        await store.aclose()
        server.stop()
