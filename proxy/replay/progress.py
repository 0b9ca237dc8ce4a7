"""A one-line progress display on a terminal: steps done out of the total, and time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TextIO

from proxy.replay.records import StepRecord


class Progress:
    """Rewrites one line with a carriage return, at most every ``interval`` seconds."""

    def __init__(
        self,
        label: str,
        total: int,
        stream: TextIO,
        *,
        enabled: bool,
        interval: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._label = label
        self._total = total
        self._stream = stream
        self._enabled = enabled
        self._interval = interval
        self._clock = clock
        self._started = clock()
        self._shown_at = -interval
        self.done = 0
        self.errors = 0

    def record(self, step: StepRecord) -> None:
        self.advance(error=step.error is not None)

    def advance(self, *, error: bool = False) -> None:
        self.done += 1
        self.errors += error
        now = self._clock()
        if self._enabled and (now - self._shown_at >= self._interval or self.done == self._total):
            self._shown_at = now
            self._show(now)

    def close(self) -> None:
        if self._enabled and self.done:
            self._show(self._clock())
            self._stream.write("\n")
            self._stream.flush()

    def _show(self, now: float) -> None:
        share = self.done / self._total * 100 if self._total else 100.0
        errors = f", {self.errors} errors" if self.errors else ""
        self._stream.write(
            f"\r{self._label}: {self.done}/{self._total} steps ({share:.0f}%){errors}, "
            f"{now - self._started:.1f} s"
        )
        self._stream.flush()
