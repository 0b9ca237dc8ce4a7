"""Scale-out for real: two `prefill-proxy serve` replicas sharing a valkey-server, three
simulator engines, nginx choosing a replica at random per request. A conversation stays
on one engine whichever replica serves it; an engine killed between steps moves its
sessions once and only once, with no client error; the store killed costs sessions, not
requests."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redis
from prometheus_client import CollectorRegistry

from proxy.metrics import Metrics
from proxy.redis_store import RedisStore
from tests.support.fleet import Engine, counter, fleet, scrape
from tests.support.valkey import Valkey

SESSIONS = 6
SECRET = "sk-scale-out-secret-0123"  # the client's key: forwarded, never stored


def system(index: int) -> dict[str, str]:
    """A system prompt of each conversation's own (a prefix family each, placed apart)."""
    return {"role": "system", "content": f"You are airline {index}'s booking agent. Be brief."}


class Conversations:
    """SESSIONS conversations, each with its own X-Session-Id, one step at a time."""

    def __init__(self, front: str) -> None:
        self.front = front
        self.histories: dict[str, list[dict[str, Any]]] = {
            f"conv-{index}": [system(index)] for index in range(SESSIONS)
        }
        self.statuses: collections.Counter[int] = collections.Counter()

    def step(self, number: int) -> None:
        asyncio.run(self._step(number))

    async def _step(self, number: int) -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            await asyncio.gather(*(self._one(client, s, number) for s in self.histories))

    async def _one(self, client: httpx.AsyncClient, session: str, number: int) -> None:
        history = self.histories[session]
        history.append({"role": "user", "content": f"Step {number} of {session}: next flight?"})
        response = await client.post(
            self.front + "/v1/chat/completions",
            json={"model": "sim-model", "messages": history, "max_tokens": 8},
            headers={"x-session-id": session, "authorization": f"Bearer {SECRET}"},
        )
        self.statuses[response.status_code] += 1
        if response.status_code == 200:
            history.append(response.json()["choices"][0]["message"])
        else:
            history.pop()


def engines_of(store: Valkey, sessions: list[str]) -> dict[str, str]:
    """Each session's engine, as its record in the shared store says."""

    async def read() -> dict[str, str]:
        redis = RedisStore(
            store.url,
            Metrics(CollectorRegistry()),
            ttl_s=60,
            max_sessions=100,
            max_bytes=1 << 20,
            timeout=2,
        )
        try:
            records = {s: await redis.get("h:" + s) for s in sessions}
        finally:
            await redis.aclose()
        return {s: r.engine for s, r in records.items() if r is not None}

    return asyncio.run(read())


def assert_no_secret_in(store: Valkey) -> None:
    """Credentials are forwarded, never stored: not in any key or value of the store."""
    client = redis.Redis.from_url(store.url)
    try:
        keys = list(client.scan_iter())
        assert any(key.startswith(b"prefill-proxy:s:") for key in keys)
        for key in keys:
            kind = client.type(key)
            values = [client.get(key)] if kind == b"string" else client.zrange(key, 0, -1)
            for blob in [key, *values]:
                assert SECRET.encode() not in (blob or b"")
    finally:
        client.close()


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Bounded wait for state the proxies reach by themselves (a probe's result)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.05)


def routing(replicas: list[str], decision: str, reason: str = "") -> float:
    name = "prefill_proxy_routing_decisions_total"
    labels = {"decision": decision, **({"reason": reason} if reason else {})}
    return sum(counter(scrape(url), name, **labels) for url in replicas)


@pytest.fixture
def store() -> Iterator[Valkey]:
    server = Valkey()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def engines() -> Iterator[list[Engine]]:
    started = [Engine() for _ in range(3)]
    for engine in started:
        engine.start()
    yield started
    for engine in started:
        engine.kill()


def test_a_conversation_stays_on_its_engine_and_moves_once_when_it_dies(
    store: Valkey, engines: list[Engine]
) -> None:
    with fleet(2, engines, store) as (front, replicas):
        talk = Conversations(front)
        for number in range(3):
            talk.step(number)
        assert talk.statuses == {200: 3 * SESSIONS}
        placed = engines_of(store, list(talk.histories))
        assert len(placed) == SESSIONS and set(placed.values()) <= {e.url for e in engines}
        # Placed once (by whichever replica came first), then found by both.
        assert routing(replicas, "new") == SESSIONS
        assert routing(replicas, "affinity") == 2 * SESSIONS
        assert routing(replicas, "moved") == 0
        served = [counter(scrape(url), "prefill_proxy_requests_total") for url in replicas]
        assert all(count > 0 for count in served)  # the balancer did use both replicas

        counts = collections.Counter(placed.values())
        doomed_url = counts.most_common(1)[0][0]
        doomed = next(e for e in engines if e.url == doomed_url)
        doomed.kill()  # between steps: no request in flight on it
        for number in range(3, 6):
            talk.step(number)
        assert talk.statuses == {200: 6 * SESSIONS}  # no client saw the engine go
        now = engines_of(store, list(talk.histories))
        for session, url in placed.items():
            if url == doomed_url:
                assert now[session] not in ("", doomed_url)
            else:
                assert now[session] == url  # the others never moved
        # Each of its sessions moved once, whichever replica noticed first; then stayed.
        assert routing(replicas, "moved") == counts[doomed_url]
        assert routing(replicas, "new") == SESSIONS
        assert_no_secret_in(store)
        for url in replicas:  # /ready counts what the probes see (each 0.2 s)
            wait_until(lambda u=url: httpx.get(u + "/ready").json()["healthy"] == 2)
            ready = httpx.get(url + "/ready", timeout=5)
            assert ready.status_code == 200
            assert ready.json() == {"status": "ready", "engines": 3, "healthy": 2}


def test_the_store_killed_mid_run_costs_sessions_not_requests(
    store: Valkey, engines: list[Engine]
) -> None:
    with fleet(2, engines, store) as (front, replicas):
        talk = Conversations(front)
        talk.step(0)
        talk.step(1)
        placed = engines_of(store, list(talk.histories))
        store.kill()
        talk.step(2)  # no store: the requests go on without their sessions
        errors = sum(
            counter(scrape(url), "prefill_proxy_session_store_errors_total") for url in replicas
        )
        assert errors > 0
        store.start()  # back, empty
        # Traffic goes on; within a second or so (the store is skipped a second after a
        # failure) the replicas use it again by themselves.
        number, deadline = 3, time.monotonic() + 30
        while len(engines_of(store, list(talk.histories))) < SESSIONS:
            assert time.monotonic() < deadline, "the replicas never used the restarted store"
            talk.step(number)
            number += 1
        talk.step(number)
        assert talk.statuses == {200: (number + 1) * SESSIONS}
        # Records were lost with the store; rendezvous hashing put each session back on
        # the engine that still holds its prefix.
        assert engines_of(store, list(talk.histories)) == placed
        loaded = sum(
            counter(scrape(url), "prefill_proxy_sessions_loaded_total", outcome="found")
            for url in replicas
        )
        assert loaded >= SESSIONS  # the last step found what the one before saved
