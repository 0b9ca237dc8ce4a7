"""What each engine's recent timed warm-ups showed: whether they had to recompute evicted
blocks, and whether their steps then found what they warmed. The warmer writes it as
warm-ups finish and steps come back, and asks it before each timed warm-up
(proxy.warmup.policy.timed_skip decides). In memory, per replica: a reading of the
engine's cache pressure, not session state.
"""

from __future__ import annotations

import collections

from proxy.warmup.policy import CACHED_STREAK, OUTCOMES_KEPT, thrashing, timed_skip

AWAITING_KEPT = 4096  # timed warm-ups whose step has not come yet (abandoned ones age out)


class TimedLedger:
    def __init__(self) -> None:
        self._recomputed: dict[str, collections.deque[bool]] = {}
        self._missed: dict[str, collections.deque[bool]] = {}
        self._skipped: dict[str, int] = {}  # timed warm-ups skipped since one went
        # Timed warm-ups done whose step has not come yet: session -> (engine, tokens).
        self._awaiting: collections.OrderedDict[str, tuple[str, int]] = collections.OrderedDict()

    def skip(self, engine: str) -> str | None:
        """Why the next timed warm-up for ``engine`` should not go, or None; a skip is
        counted towards the next probe."""
        recomputed = self._recomputed.get(engine, ())
        missed = self._missed.get(engine, ())
        skipped = self._skipped.get(engine, 0)
        reason = timed_skip(list(recomputed), list(missed), skipped)
        self._skipped[engine] = skipped + 1 if reason is not None else 0
        return reason

    def thrashing(self, engine: str) -> bool:
        """Whether ``engine``'s recent timed warm-ups were mostly evicted before use (not
        counted towards a probe)."""
        return thrashing(list(self._missed.get(engine, ())))

    def warmed(self, engine: str, *, recomputed: bool, session: str, tokens: int) -> None:
        """A timed warm-up finished; with ``tokens`` > 0 its step is still to come (the
        client was away), to be judged by ``step``."""
        _history(self._recomputed, engine, CACHED_STREAK).append(recomputed)
        if tokens:
            self._awaiting[session] = (engine, tokens)
            self._awaiting.move_to_end(session)
            while len(self._awaiting) > AWAITING_KEPT:
                self._awaiting.popitem(last=False)

    def step(self, session: str, cached_tokens: int | None) -> None:
        """The session's next step came back with ``cached_tokens`` found in the cache
        (None: unknown, or not the step its timed warm-up was for)."""
        awaited = self._awaiting.pop(session, None)
        if awaited is not None and cached_tokens is not None:
            engine, tokens = awaited
            _history(self._missed, engine, OUTCOMES_KEPT).append(cached_tokens < tokens)


def _history(
    table: dict[str, collections.deque[bool]], engine: str, size: int
) -> collections.deque[bool]:
    return table.setdefault(engine, collections.deque(maxlen=size))
