"""Time for the engine, injectable: real monotonic time, or a manual clock for tests."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(seconds, 0.0))


class ManualClock:
    """Virtual time: ``sleep`` advances it at once (and yields to the loop), so a test of
    the engine runs as fast as the CPU allows and sees exact modelled times."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        self._now += max(seconds, 0.0)
        await asyncio.sleep(0)

    def advance(self, seconds: float) -> None:
        self._now += seconds
