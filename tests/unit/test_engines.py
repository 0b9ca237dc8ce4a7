"""Choosing an engine: rendezvous placement, moving once and staying, least loaded, probes."""

from __future__ import annotations

import asyncio
import collections

import pytest
from prometheus_client import CollectorRegistry

from proxy.engines import Engine, Engines, least_loaded, place, ranking
from proxy.metrics import Metrics

URLS = [f"http://engine-{index}:8000" for index in range(4)]
KEYS = [f"f:session-{index}" for index in range(2000)]


def fleet() -> list[Engine]:
    return [Engine(url) for url in URLS]


def test_every_replica_ranks_the_same_whatever_the_order_it_lists_engines() -> None:
    engines = fleet()
    for key in KEYS[:50]:
        first = [e.url for e in ranking(key, engines)]
        assert [e.url for e in ranking(key, list(reversed(engines)))] == first


def test_sessions_spread_and_losing_an_engine_moves_only_its_own() -> None:
    engines = fleet()
    placed = {key: place(key, "", engines, 0).engine.url for key in KEYS}
    counts = collections.Counter(placed.values())
    assert min(counts.values()) > len(KEYS) / 4 * 0.8  # about a quarter each
    without = [e for e in engines if e.url != URLS[0]]
    for key, url in placed.items():
        again = place(key, "", without, 0).engine.url
        if url != URLS[0]:
            assert again == url  # nobody else's session moves


def test_a_session_stays_moves_once_and_does_not_come_back() -> None:
    engines = fleet()
    key = KEYS[7]
    first = place(key, "", engines, 0)
    assert first.decision == "new" and first.engine is ranking(key, engines)[0]
    assert place(key, first.engine.url, engines, 0).decision == "affinity"
    first.engine.healthy = False
    moved = place(key, first.engine.url, engines, 0)
    assert (moved.decision, moved.reason) == ("moved", "unhealthy")
    assert moved.engine is ranking(key, engines)[1]
    first.engine.healthy = True  # back: new sessions may go there, this one stays
    assert place(key, moved.engine.url, engines, 0) == type(moved)(moved.engine, "affinity")
    gone = place(key, "http://scaled-away:8000", engines, 0)
    assert (gone.decision, gone.reason) == ("moved", "removed")


def test_an_overloaded_engine_takes_no_new_or_moving_session() -> None:
    engines = fleet()
    key = KEYS[3]
    top = ranking(key, engines)[0]
    top.waiting = 50
    assert place(key, "", engines, max_waiting=10).engine is not top
    assert place(key, "", engines, max_waiting=0).engine is top  # no threshold: ignored
    moved = place(key, top.url, engines, max_waiting=10)
    assert (moved.decision, moved.reason) == ("moved", "overloaded")


def test_nowhere_better_to_go_keeps_the_session_where_it_is() -> None:
    engines = fleet()
    for engine in engines:
        engine.healthy = False
    assert place(KEYS[0], URLS[2], engines, 0).engine.url == URLS[2]


def test_requests_without_a_session_go_to_the_least_loaded_usable_engine() -> None:
    engines = fleet()
    engines[0].in_flight, engines[1].in_flight, engines[2].in_flight = 5, 1, 0
    engines[3].in_flight, engines[2].healthy = 0, False
    assert least_loaded(engines, 0) is engines[3]


def test_probes_mark_engines_and_read_their_queue() -> None:
    metrics = Metrics(CollectorRegistry())
    engines = Engines(URLS[:2], metrics, max_waiting=5, probe_interval=0.01)
    answers = {
        (URLS[0], "/health"): (200, b""),
        (URLS[0], "/metrics"): (200, b'vllm:num_requests_waiting{model_name="m"} 7.0\n'),
        (URLS[1], "/health"): (503, b""),
    }
    probed = asyncio.Event()

    async def get(base: str, path: str) -> tuple[int, bytes]:
        if base == URLS[1]:
            probed.set()
        return answers[(base, path)]

    async def probe_once() -> None:
        task = asyncio.create_task(engines.run(get))
        await probed.wait()
        await asyncio.sleep(0)
        task.cancel()

    asyncio.run(probe_once())
    first, second = engines.engines
    assert first.healthy and first.waiting == 7.0 and not second.healthy
    assert metrics.registry.get_sample_value("prefill_proxy_engines_healthy") == 1
    assert first.unusable(5) == "overloaded" and second.unusable(5) == "unhealthy"


@pytest.mark.parametrize("addresses", [["10.0.0.2", "10.0.0.1"], ["fd00::1"]])
def test_a_headless_service_name_becomes_one_engine_per_address(addresses: list[str]) -> None:
    metrics = Metrics(CollectorRegistry())
    asked: list[tuple[str, int]] = []

    async def resolve(host: str, port: int) -> list[str]:
        asked.append((host, port))
        return addresses

    engines = Engines(
        ["http://vllm-headless.default.svc:8000"], metrics, dns_refresh=30, resolve=resolve
    )
    asyncio.run(engines.resolve())  # at start-up; run() then re-resolves each dns_refresh
    assert asked == [("vllm-headless.default.svc", 8000)]
    hosts = [f"[{a}]" if ":" in a else a for a in sorted(addresses)]
    assert [e.url for e in engines.engines] == [f"http://{h}:8000" for h in hosts]


def test_a_family_stays_together_until_its_engine_is_crowded() -> None:
    """Conversations sharing a system prompt and tools rank engines alike (one key): they
    join the first while it carries under the floor, then spill along their ranking, and
    under load every engine ends within the bound of the mean."""
    engines = fleet()
    family = "f:shared-system-prompt-and-tools"
    ranked = ranking(family, engines)
    placed = []
    for _ in range(8):  # light load: all on the family's first engine
        engine = place(family, "", engines, 0, spread_load=8).engine
        engine.in_flight += 1
        placed.append(engine)
    assert all(engine is ranked[0] for engine in placed)
    spilled = place(family, "", engines, 0, spread_load=8).engine
    assert spilled is ranked[1]  # the first is at the floor and above 1.25x the mean
    for _ in range(200):  # heavy load: bounded
        place(family, "", engines, 0, spread_load=8).engine.in_flight += 1
    loads = [e.load for e in engines]
    assert max(loads) <= 1.25 * (sum(loads) / len(loads)) + 1


def test_the_bound_counts_what_the_engines_report() -> None:
    engines = fleet()
    family = "f:another-family"
    first = ranking(family, engines)[0]
    first.running, first.waiting = 30.0, 0.0  # busy with other proxies' requests
    assert place(family, "", engines, 0, spread_load=8).engine is not first
    assert place(family, "", engines, 0, spread_load=0).engine is first  # 0: no bound
