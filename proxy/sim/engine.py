"""The engine loop: schedule a step, wait the time it costs, apply it, hand out tokens.

Time comes from an injected clock and the cost model; ``speed`` divides every step's
modelled duration (speed 100: a hundred times faster than the modelled GPU). Steps are
paced against a running deadline, so a late wake-up is made up by the next step instead
of slowing the simulated GPU down.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence

from proxy.sim.clock import Clock
from proxy.sim.metrics import SimMetrics
from proxy.sim.scheduler import Sampled, Scheduled, Scheduler
from proxy.sim.scheduler import Sequence as SimSequence
from proxy.sim.timing import CostModel

log = logging.getLogger("prefill_proxy.sim")


class EngineFailed(RuntimeError):
    """The engine loop stopped on an unexpected error; pending requests cannot finish."""


@dataclasses.dataclass(eq=False)
class Handle:
    """One submitted request: its sequence, its token events and its timestamps."""

    seq: SimSequence
    arrival: float
    finish_reason: str = "stop"  # the engine-level reason, for metrics: "stop" or "length"
    queue: asyncio.Queue[Sampled | EngineFailed] = dataclasses.field(default_factory=asyncio.Queue)
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None

    @property
    def prompt_tokens(self) -> int:
        return self.seq.prompt_len

    @property
    def cached_tokens(self) -> int:
        return self.seq.cached_tokens or 0

    @property
    def created_cache_tokens(self) -> int:
        """Prompt tokens this request newly wrote to the cache (vLLM's PrefillStats):
        its full prompt blocks minus those it found cached."""
        size = self.seq.block_size
        return max(0, self.prompt_tokens // size * size - self.cached_tokens)

    @property
    def completion_tokens(self) -> int:
        return self.seq.num_sampled

    async def tokens(self) -> AsyncIterator[int]:
        """The index of each planned output token, as the engine produces it."""
        while True:
            event = await self.queue.get()
            if isinstance(event, EngineFailed):
                raise event
            yield event.index
            if event.finished:
                return


class Engine:
    def __init__(
        self,
        scheduler: Scheduler,
        cost: CostModel,
        clock: Clock,
        *,
        speed: float = 1.0,
        metrics: SimMetrics | None = None,
    ) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.scheduler = scheduler
        self.cost = cost
        self.clock = clock
        self.speed = speed
        self.metrics = metrics
        self._handles: dict[SimSequence, Handle] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        if metrics is not None:
            metrics.observe_engine(
                running=lambda: len(scheduler.running),
                waiting=lambda: len(scheduler.waiting),
                kv_usage=scheduler.kv.pool.usage,
            )

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def submit(
        self,
        request_id: str,
        prompt: Sequence[int],
        outputs: Sequence[int],
        finish_reason: str = "stop",
        cache_salt: str = "",
    ) -> Handle:
        seq = SimSequence(request_id, prompt, outputs, self.scheduler.kv.block_size, cache_salt)
        handle = Handle(seq, self.clock.now(), finish_reason)
        self._handles[seq] = handle
        self.scheduler.add(seq)
        self.start()
        self._wake.set()
        return handle

    def abort(self, handle: Handle) -> None:
        """Stop a request (its client left): its blocks are freed at once."""
        self.scheduler.abort(handle.seq)
        self._handles.pop(handle.seq, None)
        self._wake.set()  # freed blocks may let a waiting request in

    def reset_prefix_cache(self) -> bool:
        return self.scheduler.kv.reset()

    async def _run(self) -> None:
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug: fail every pending request instead of hanging it
            log.exception("simulator engine stopped")
            for handle in self._handles.values():
                handle.queue.put_nowait(EngineFailed(str(exc)))
            self._handles.clear()

    async def _loop(self) -> None:
        deadline = self.clock.now()
        while True:
            if not self.scheduler.has_work():
                self._wake.clear()
                await self._wake.wait()
                continue
            start = self.clock.now()
            step = self.scheduler.schedule()
            if not step.scheduled:  # nothing fits now: wait for an abort or a new request
                self._wake.clear()
                await self._wake.wait()
                continue
            self._admitted(step.scheduled, start)
            duration, compute = self.cost.step_cost(step.work())
            duration, compute = duration / self.speed, compute / self.speed
            deadline = max(deadline, start) + duration
            await self.clock.sleep(deadline - self.clock.now())
            now = self.clock.now()
            for sampled in self.scheduler.complete(step):
                self._deliver(sampled, now)
            if self.metrics is not None:
                self.metrics.preempted(len(step.preempted))
                self.metrics.busy_seconds.inc(duration)
                self.metrics.compute_seconds.inc(compute)

    def _admitted(self, scheduled: list[Scheduled], now: float) -> None:
        for item in scheduled:
            handle = self._handles.get(item.seq)
            if handle is None or not item.first_admission:
                continue
            handle.scheduled_at = now
            if self.metrics is not None:
                self.metrics.admitted(handle)

    def _deliver(self, sampled: Sampled, now: float) -> None:
        handle = self._handles.get(sampled.seq)
        if handle is None:
            return
        if handle.first_token_at is None:
            handle.first_token_at = now
            if self.metrics is not None:
                self.metrics.first_token(handle)
        elif self.metrics is not None and handle.last_token_at is not None:
            self.metrics.inter_token(now - handle.last_token_at)
        handle.last_token_at = now
        if self.metrics is not None:
            self.metrics.generated(1)
        if sampled.finished:
            handle.finished_at = now
            del self._handles[sampled.seq]
            if self.metrics is not None:
                self.metrics.finished(handle)
        handle.queue.put_nowait(sampled)
