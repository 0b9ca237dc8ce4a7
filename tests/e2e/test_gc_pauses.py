"""The collector's pauses on /metrics: observed from start-up to shutdown of a served app."""

from __future__ import annotations

import asyncio
import gc

import aiohttp
import httpx
from prometheus_client import CollectorRegistry

from proxy import config
from proxy.app import create_app
from tests.benchmarks import overhead
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import serve

FULL = {"generation": "2"}


def test_a_full_collection_shows_as_a_pause_of_generation_2(fake_upstream: FakeUpstream) -> None:
    registry = CollectorRegistry()
    settings = config.load({"upstream": fake_upstream.url}, environ={})
    callbacks = len(gc.callbacks)
    with serve(create_app(settings, registry=registry)) as url:
        # Answered once start-up is done (its collections: frozen, then observed).
        assert httpx.get(url + "/health").status_code == 200
        count = lambda: registry.get_sample_value("prefill_proxy_gc_pause_seconds_count", FULL)  # noqa: E731
        before = count() or 0.0
        gc.collect()  # the server runs in this process: the same collector
        assert (count() or 0.0) >= before + 1
        scraped = httpx.get(url + "/metrics").text
        assert 'prefill_proxy_gc_pause_seconds_bucket{generation="2",le="0.0005"}' in scraped
    assert len(gc.callbacks) == callbacks  # shut down: no longer observed


def test_the_overhead_benchmark_reads_what_the_collector_took(fake_upstream: FakeUpstream) -> None:
    settings = config.load({"upstream": fake_upstream.url}, environ={})

    async def read(url: str) -> tuple[float | None, float | None, float | None]:
        async with aiohttp.ClientSession() as session:
            assert (await session.get(url + "/health")).status == 200  # started up
            proxy = overhead.Target("proxy", url, None, proxy=True)
            before = await overhead._collector_s(session, proxy)
            gc.collect()
            after = await overhead._collector_s(session, proxy)
            other = overhead.Target("passthrough", url, None)  # not asked
            return before, after, await overhead._collector_s(session, other)

    with serve(create_app(settings, registry=CollectorRegistry())) as url:
        before, after, other = asyncio.run(read(url))
    assert before is not None and after is not None and after > before
    assert other is None
