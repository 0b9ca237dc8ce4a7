"""How much of the recent wall time each engine spent bringing client requests to their first
token (queued or prefilling), from this proxy's own exchanges: whether the engine has idle
time a warm-up could use. A warm-up moves prefill into the client's tool round; where the
engine is already prefilling for clients most of the time there is no idle time to move it
into, and what it computes is evicted again before the step (the thrashing cells of
tests/benchmarks/warmup_matrix.py). In memory, per replica: each replica sees only its own
clients, so with several the share reads low (warm-ups are then judged as with one). Only
streamed requests have a first token; non-streamed ones are not counted.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

WINDOW_S = 30.0  # the recent past the share is read over
KEPT = 4096  # exchanges kept per engine (a busier engine's share reads over less time)
MAX_AGE_S = 1.0  # a share read this recently is used again (the reading sorts its spans)
# An engine seen for less than the window is read over the time seen, from this long on:
# a proxy that just started must not send a burst of warm-ups to a saturated engine.
MIN_SEEN_S = 5.0


class PrefillLoad:
    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock  # the exchanges' clock (Exchange.started)
        self._spans: dict[str, collections.deque[tuple[float, float]]] = {}
        self._read: dict[str, tuple[float, float]] = {}  # engine -> (when, share)
        self._first: dict[str, float] = {}  # engine -> the start of the first span seen

    def add(self, engine: str, started: float, first_token_at: float) -> None:
        spans = self._spans.setdefault(engine, collections.deque(maxlen=KEPT))
        spans.append((started, first_token_at))
        self._first.setdefault(engine, started)

    def share(self, engine: str) -> float:
        """The part of the last WINDOW_S seconds (or of the time seen, if shorter) in which
        at least one client request to ``engine`` was waiting for its first token; 0 when
        it was seen for less than MIN_SEEN_S."""
        spans = self._spans.get(engine)
        now = self._clock()
        seen = min(now - self._first.get(engine, now), WINDOW_S)
        if not spans or seen < MIN_SEEN_S:
            return 0.0
        read = self._read.get(engine)
        if read is not None and now - read[0] < MAX_AGE_S:
            return read[1]
        since = now - seen
        while spans and spans[0][1] < since:  # appended in the order they ended, about
            spans.popleft()
        busy, reach = 0.0, since
        for start, end in sorted(spans):
            start, end = max(start, reach), min(end, now)
            if end > start:
                busy += end - start
                reach = end
        self._read[engine] = (now, busy / seen)
        return busy / seen
