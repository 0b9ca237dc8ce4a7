"""Reading the engine's /metrics: the parsing (pure) and the background poller."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from proxy.engine import (
    QUEUE_MIN_READINGS,
    QUEUE_WINDOW_S,
    EngineMonitor,
    EngineStatus,
    QueueReadings,
    parse_metrics,
)
from proxy.errors import UpstreamError
from proxy.sim.metrics import SimMetrics
from tests.support.clock import Clock

# As vLLM 0.32 writes them (two data-parallel engines), with the series that share a prefix.
VLLM_TEXT = b"""\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny-qwen2"} 2.0
vllm:num_requests_waiting{engine="1",model_name="tiny-qwen2"} 1.0
# HELP vllm:num_requests_waiting_by_reason Number of waiting requests by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny-qwen2",reason="capacity"} 2.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{cache_dtype="auto",block_size="32",enable_prefix_caching="True"} 1.0
vllm:num_requests_running{engine="0",model_name="tiny-qwen2"} 4.0
"""


@pytest.mark.parametrize(
    ("text", "waiting", "block_size"),
    [
        (VLLM_TEXT, 3, 32),
        (b"", None, None),
        (b"# only comments\nother_metric 5\n", None, None),
        (b"vllm:num_requests_waiting 7\n", 7, None),  # no labels at all
        (b'vllm:num_requests_waiting{engine="0"} NaN\n', None, None),  # not set yet
        (b'vllm:cache_config_info{engine="0",block_size="16"} 1.0\n', None, 16),
        (b'vllm:cache_config_info{engine="0",num_gpu_blocks_override="32"} 1.0\n', None, None),
        (b'vllm:cache_config_info{block_size="0"} 1.0\n', None, None),
    ],
)
def test_parse_metrics(text: bytes, waiting: int | None, block_size: int | None) -> None:
    status = parse_metrics(text, read_at=5.0)
    assert (status.waiting, status.block_size, status.read_at) == (waiting, block_size, 5.0)


def test_parse_metrics_reads_the_simulators_exposition() -> None:
    registry = CollectorRegistry()
    metrics = SimMetrics(registry, "m", max_model_len=4096, block_size=16, num_blocks=512)
    metrics.observe_engine(running=lambda: 1, waiting=lambda: 4, kv_usage=lambda: 0.5)
    assert parse_metrics(generate_latest(registry)) == EngineStatus(4, 16, 0.0)


class Engine:
    """What the monitor fetches: a fixed answer, or an error to raise."""

    def __init__(self, status: int = 200, body: bytes = VLLM_TEXT) -> None:
        self.status, self.body = status, body
        self.error: Exception | None = None
        self.calls = 0

    async def __call__(self, path: str) -> tuple[int, bytes]:
        assert path == "/metrics"
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.status, self.body


@pytest.mark.anyio
async def test_the_monitor_reads_while_wanted_then_stops() -> None:
    engine, clock = Engine(), Clock()
    monitor = EngineMonitor(engine, interval=0.0, linger=10.0, clock=clock)
    assert monitor.status == EngineStatus() and engine.calls == 0  # nothing until wanted
    status = await monitor.fresh(max_age=1.0)
    assert (status.waiting, status.block_size, status.read_at) == (3, 32, 100.0)
    assert monitor.block_size == 32
    clock.now += 10.0  # nobody asked for ten seconds: the poller ends by itself
    task = monitor._task
    assert task is not None
    await asyncio.wait_for(task, 5)
    calls = engine.calls
    await asyncio.sleep(0)
    assert engine.calls == calls
    monitor.want()  # asked again: it starts again
    await monitor.fresh(max_age=0.0)
    assert engine.calls > calls
    await monitor.aclose()


@pytest.mark.anyio
async def test_an_engine_without_metrics_reads_as_unknown_and_keeps_its_block_size() -> None:
    engine, clock = Engine(), Clock()
    monitor = EngineMonitor(engine, interval=0.0, clock=clock)
    await monitor.fresh(max_age=1.0)
    engine.status = 404
    clock.now += 1.0
    status = await monitor.fresh(max_age=0.0)
    assert status.waiting is None and monitor.block_size == 32
    engine.error = UpstreamError("refused")
    clock.now += 1.0
    status = await monitor.fresh(max_age=0.0)
    assert status == EngineStatus(read_at=clock.now)
    await monitor.aclose()
    assert monitor._task is None


@pytest.mark.anyio
async def test_fresh_gives_the_last_reading_when_none_comes_in_time() -> None:
    engine, clock = Engine(), Clock()
    monitor = EngineMonitor(engine, interval=3600.0, clock=clock)
    first = await monitor.fresh(max_age=1.0)
    clock.now += 5.0  # older than asked, and the next scrape is an hour away
    assert await monitor.fresh(max_age=1.0, timeout=0.05) == first
    await monitor.aclose()


def test_the_queued_share_reads_the_recent_readings_only() -> None:
    readings = QueueReadings()
    for n in range(QUEUE_MIN_READINGS - 1):
        readings.add(100.0 + n, 3)
    assert readings.share(110.0, more_than=0) is None  # too few to tell
    readings.add(108.0, 0)
    assert readings.share(110.0, more_than=0) == pytest.approx(
        (QUEUE_MIN_READINGS - 1) / QUEUE_MIN_READINGS
    )
    assert readings.share(110.0, more_than=3) == 0.0  # 3 is not more than 3
    for n in range(QUEUE_MIN_READINGS):  # later, a quiet engine: the busy past is gone
        readings.add(110.0 + QUEUE_WINDOW_S + n, 0)
    assert readings.share(110.0 + QUEUE_WINDOW_S + 10.0, more_than=0) == 0.0


@pytest.mark.anyio
async def test_the_monitor_keeps_what_its_readings_said_of_the_queue() -> None:
    engine, clock = Engine(), Clock()
    monitor = EngineMonitor(engine, interval=0.0, clock=clock)
    assert monitor.queued_share(0) is None
    monitor.want()
    while engine.calls <= QUEUE_MIN_READINGS:
        await asyncio.sleep(0)
    assert monitor.queued_share(0) == 1.0 and monitor.queued_share(3) == 0.0  # 3 waiting
    await monitor.aclose()
