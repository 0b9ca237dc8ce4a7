"""What the engine says about itself in its Prometheus ``/metrics``: how many requests it
has queued and its KV block size. Parsing is pure; a small poller reads it in the
background, only while someone keeps asking (warm-ups), never on a client's request path.

vLLM exports ``vllm:num_requests_waiting{engine=...,model_name=...}`` (one sample per
engine; data-parallel servers have several, summed here) and
``vllm:cache_config_info{block_size="16",...} 1.0``, an info-style gauge whose labels are
the cache config (vllm/v1/metrics/loggers.py ``log_metrics_info``). A scrape is 50-200 kB
of exposition text, mostly histograms: two anchored regular expressions find the two
series without parsing the rest.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import re
import time
from collections.abc import Awaitable, Callable

from proxy.errors import UpstreamError

log = logging.getLogger("prefill_proxy.engine")

METRICS_PATH = "/metrics"
_WAITING = re.compile(rb"^vllm:num_requests_waiting(?:\{[^}\n]*\})? +(\S+)", re.MULTILINE)
_CACHE_INFO = re.compile(rb"^vllm:cache_config_info\{([^}\n]*)\}", re.MULTILINE)
_BLOCK_SIZE = re.compile(rb'(?:^|,)\s*block_size="(\d+)"')

QUEUE_WINDOW_S = 30.0  # the recent past ``queued_share`` reads over
QUEUE_MIN_READINGS = 6  # fewer readings than this in it: no share yet
READINGS_KEPT = 128  # a reading a second: two minutes' worth

# (status, body) of a GET on the engine: Upstream.call bound to a path.
Fetch = Callable[[str], Awaitable[tuple[int, bytes]]]


@dataclasses.dataclass(frozen=True)
class EngineStatus:
    """One reading. ``None``: the engine did not say (not vLLM, no metrics, not read yet)."""

    waiting: int | None = None
    block_size: int | None = None
    read_at: float = 0.0  # time.monotonic() of the scrape; 0: never read


def parse_metrics(text: bytes, read_at: float = 0.0) -> EngineStatus:
    """The waiting-request count (summed over engines) and the block size in a Prometheus
    text exposition; fields the text lacks stay ``None``."""
    waiting = None
    for match in _WAITING.finditer(text):
        try:
            value = float(match.group(1))
        except ValueError:
            continue
        if value == value:  # NaN: a gauge with no value yet
            waiting = (waiting or 0) + int(value)
    block_size = None
    info = _CACHE_INFO.search(text)
    if info is not None and (size := _BLOCK_SIZE.search(info.group(1))) is not None:
        block_size = int(size.group(1)) or None
    return EngineStatus(waiting, block_size, read_at)


class QueueReadings:
    """Recent readings of the engine's queue: how much of the recent past it had no room
    for more work, whoever sent it (every proxy replica, other clients)."""

    def __init__(self) -> None:
        self._readings: collections.deque[tuple[float, int]] = collections.deque(
            maxlen=READINGS_KEPT
        )

    def add(self, read_at: float, waiting: int) -> None:
        self._readings.append((read_at, waiting))

    def share(self, now: float, more_than: int) -> float | None:
        """The share of the last QUEUE_WINDOW_S seconds' readings in which the engine queued
        more than ``more_than`` requests; None with fewer than QUEUE_MIN_READINGS (just
        started, or an engine that does not say)."""
        since = now - QUEUE_WINDOW_S
        recent = [waiting for read_at, waiting in self._readings if read_at >= since]
        if len(recent) < QUEUE_MIN_READINGS:
            return None
        return sum(waiting > more_than for waiting in recent) / len(recent)


class EngineMonitor:
    """Keeps a recent EngineStatus while it is wanted.

    ``want()`` (cheap, synchronous) keeps the poller alive for ``linger`` seconds more; it
    starts the poller if it is not running. The poller scrapes every ``interval`` seconds
    and stops by itself once nobody has wanted it for ``linger`` seconds, so an idle proxy
    sends the engine nothing. ``fresh()`` waits (bounded) for a reading newer than
    ``max_age`` for callers that can wait (a background warm-up), and never raises.
    """

    def __init__(
        self,
        fetch: Fetch,
        *,
        interval: float = 1.0,
        linger: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._interval = interval
        self._linger = linger
        self._clock = clock
        self.status = EngineStatus()
        self._wanted_until = 0.0
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Condition()
        # The block size never changes while the engine runs: kept once read.
        self._block_size: int | None = None
        self._queue = QueueReadings()

    @property
    def block_size(self) -> int | None:
        return self._block_size

    def queued_share(self, more_than: int) -> float | None:
        """QueueReadings.share of this engine's readings, now."""
        return self._queue.share(self._clock(), more_than)

    def want(self) -> None:
        """Keep the readings coming for a while (starts the poller in this event loop)."""
        self._wanted_until = self._clock() + self._linger
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._poll())

    async def fresh(self, max_age: float, timeout: float = 2.0) -> EngineStatus:
        """A reading at most ``max_age`` old if one comes within ``timeout``, else the last
        one (possibly the empty, never-read one)."""
        self.want()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout), self._changed:
                await self._changed.wait_for(
                    lambda: (
                        self.status.read_at > 0 and self._clock() - self.status.read_at <= max_age
                    )
                )
        return self.status

    async def read(self) -> EngineStatus:
        """Scrape once now; a failure gives a reading with nothing known."""
        now = self._clock()
        try:
            status, body = await self._fetch(METRICS_PATH)
        except UpstreamError as exc:
            log.debug("engine metrics unavailable: %s", exc)
            return EngineStatus(read_at=now)
        if status != 200:
            return EngineStatus(read_at=now)
        return parse_metrics(body, now)

    async def _poll(self) -> None:
        # The check and the return run without a pause in between: want() cannot slip in
        # after the last check and find this task still running.
        while self._clock() < self._wanted_until:
            try:
                reading = await self.read()
            except Exception:  # a bug here must not end the readings for good
                log.exception("reading the engine's metrics failed")
                reading = EngineStatus(read_at=self._clock())
            if reading.block_size is not None:
                self._block_size = reading.block_size
            if reading.waiting is not None:
                self._queue.add(reading.read_at, reading.waiting)
            async with self._changed:
                self.status = reading
                self._changed.notify_all()
            await asyncio.sleep(self._interval)

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
