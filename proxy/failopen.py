"""Logging fail-open events as an operator wants them: the first of each kind with its
traceback, then one WARNING line at most every ``interval`` seconds per kind (saying how
many were left out), and every traceback at DEBUG. A body that trips a rewrite on every
request must not flood the log."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

# Kinds remembered at most (bounded: a kind is a transform or component name and an
# exception type, never request data).
MAX_KINDS = 256


class FailOpenLog:
    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        outcome: str = "failing open",
    ) -> None:
        self._logger = logger
        self._outcome = outcome
        self._interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}
        self._left_out: dict[str, int] = {}

    def failed(self, what: str, exc: BaseException) -> None:
        """``what`` failed with ``exc`` and the request went on without it."""
        kind = f"{what}/{type(exc).__name__}"
        now = self._clock()
        last = self._last.get(kind)
        if last is None and len(self._last) < MAX_KINDS:
            self._last[kind] = now
            self._logger.warning(
                "%s failed (%s); %s", what, _reason(exc), self._outcome, exc_info=exc
            )
            return
        if last is not None and now - last >= self._interval:
            self._last[kind] = now
            left_out = self._left_out.pop(kind, 0)
            more = f", and {left_out} more since the last line" if left_out else ""
            self._logger.warning("%s failed (%s); %s%s", what, _reason(exc), self._outcome, more)
        else:
            self._left_out[kind] = self._left_out.get(kind, 0) + 1
        if self._logger.isEnabledFor(logging.DEBUG):
            self._logger.debug("%s failed", what, exc_info=exc)


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__
