"""When to warm, and when not: pure decisions over numbers the warmer gathers.

When: right after the reply, and again shortly before the client is expected back, for a
session whose earlier tool rounds say when that is (``warm_delay``: the shortest of its
last rounds, less a lead of a tenth of it within 0.2-2 s, or as long as recent warm-ups
that recomputed evicted blocks took, at most half the round).

Why the second one, measured on the simulator replaying the dev traces with a KV cache
smaller than the sessions' working set (tests/benchmarks/warmup.py): the warm-up right
after the reply alone changed nothing (TTFT p50 of the steps after tool calls 0.8-1.2x):
those blocks were just computed, are the most recently used, and LRU evicts them during
the tool round all the same. The second one touches (or recomputes) them when they are
about to be needed. With 24 sessions, 5 s tool rounds and 40k tokens of KV, two runs:
steps that lost their prefix 174-175 -> 47-57 of 320, TTFT p50 2.1-2.7x lower, p90 lower
too, engine prefill +6-7%. A lead of a tenth of the round lost fewer prefixes than a
quarter (67 vs 76 of 320 at 3 s rounds): the earlier, the likelier its blocks are evicted
again. The first warm-up stays: it is nearly free (its blocks are cached) and covers what
the reply's decode did not (proxy.warmup.shape).

Short rounds (``short_rounds``): after a tool round under a second no warm-up goes. The
client is back before LRU can evict what the reply cached, and the warm-up would run when
the client's request arrives: with 0.5 s rounds (dev-40k-24-0.5s) 78 warm-ups, all right
after a reply, rescued no step (13 of 83 lost their prefix either way) and TTFT p50 was
0.93-0.97x off's in three runs; skipping them after a short round (and not reading the
engine for them), pooled over three runs, twice: p50 0.99x and 0.94x, p95 0.95x and 1.02x,
where off against off alone was 0.92-1.00x at p50.

Irregular rounds (``irregular``): no timed warm-up for a session whose recent rounds vary
more than SPREAD_MAX-fold. Aimed at the shortest, it fires too early for the long ones:
their blocks are evicted again before the step, and it took blocks from other sessions on
the way. On dev-40k-24-varied (tool rounds drawn from 0.5-10 s), six runs of each mode
pooled, before and after: TTFT p50 0.94x -> 0.97x off's (95% interval over the paired
steps 0.89-0.98x -> 0.94-1.01x), p95 0.93x -> 0.96x, steps that cached less with warm-up
than without 10 -> 6 of 498, engine prefill -0.6% and -1.3% -> -3.7% and -3.4% in the
two sets of runs each. The matrix's other cells (fixed rounds, or 3-9 s) never trip it.

Bounds: one warm-up in flight per session, ``warmup_max_inflight`` in all; none while the
engine queues more than ``warmup_max_waiting`` requests (its ``/metrics``, read in the
background: proxy.engine) or the proxy has more than ``warmup_max_proxy_inflight`` in
flight. A timed warm-up that finds no room waits for it (``RETRY_S`` at a time) until the
client is due, rather than giving up: vLLM counts a request as waiting until its next
scheduler step, so under load one reading often catches one in passing. Giving up at once,
a run skipped 129 warm-ups as engine_busy and came out at 1.8x; waiting, 50-56 (2.1-2.7x).

Earning its cost (``timed_skip``), from the warm-up matrix (tests/benchmarks/warmup_matrix.py):
a timed warm-up pays only where blocks are evicted during the tool round and stay until
the step comes. On a roomy cache every timed warm-up found its prefix still cached (a
/tokenize and an engine step for nothing); on a thrashing one (working set well over the
KV capacity, the engine saturated) half or more were evicted again before their step,
and the warm-ups only added work: TTFT p50 0.72x and +11.5% engine prefill with 4
parallel calls and 44 tools. Each engine's recent timed warm-ups say which it is; on a
thrashing one the warm-up right after the reply is skipped as well (``thrashing``): it
still went there and was evicted the same way.

No idle time (``saturated``): a warm-up moves prefill into the engine's idle time; while
the engine queued requests in three tenths of its recent /metrics readings it has none,
and on the matrix's saturated cells (compute busy 66-70%) the warm-ups then sent were
mostly evicted before use: none goes there. The line is the matrix's readings (the proxy's
queued share sampled every 2 s): the saturated cells read 0.32 (shared-half-50k, at or over
0.3 86% of the time, never 0.5) and 0.58 (parallel-4-44tools), every dev cell 0.03-0.12,
never 0.3. At 0.5 shared-half-50k let half its warm-ups through and lost at TTFT p50
(0.66-0.92x over four runs); at 0.3 it sends 19 (p50 0.98x and 1.08x, p95 0.99x and
1.01x in two runs), parallel-4-44tools 8 a run (pooled over three runs p50 1.02x, p95
1.01x, engine prefill -0.4%), while dev-25k-24-10s keeps its gain (2.33-2.66x). The
engine's own queue counts every replica's and client's load.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from proxy.config import Settings

# The timed warm-up: how much earlier than the client's expected return, and the tool
# rounds it is worth it for. Tuned on tests/benchmarks/warmup.py.
LEAD_SHARE = 0.1
MIN_LEAD_S = 0.2
MAX_LEAD_S = 2.0
MIN_TIMED_GAP_S = 1.0
RECOMPUTE_LEAD = 1.0  # lead at least as long as recent recomputing warm-ups took
SHORT_ROUNDS = 1  # the last tool round under MIN_TIMED_GAP_S: no warm-up after the reply
GAPS_KEPT = 4  # recent tool rounds per session that the estimate looks at
SPREAD_MAX = 3.0  # the longest of them over the shortest: beyond it, no timed warm-up
RETRY_S = 0.25  # a timed warm-up that finds no room tries again this much later
# While an engine's last CACHED_STREAK timed warm-ups all found their prefix still cached
# (nothing was evicted during those tool rounds), only one timed warm-up in PROBE_EVERY
# goes: the others would cost a /tokenize and an engine step for nothing. Likewise while
# WASTED_SHARE or more of its last OUTCOMES_KEPT timed warm-ups were evicted again before
# their step came (a cache that thrashes: they only add work to a saturated engine).
CACHED_STREAK = 8
PROBE_EVERY = 4
OUTCOMES_KEPT = 16
WASTED_SHARE = 0.5
# No warm-up at all while the engine queued requests in this share of its recent readings
# (proxy.engine.EngineMonitor.queued_share): no idle time to move prefill into.
SATURATED_SHARE = 0.3
TRIGGERS = ("tool_calls", "tool_calls_timed", "compaction")


@dataclasses.dataclass(frozen=True)
class Limits:
    max_inflight: int
    max_waiting: int
    max_proxy_inflight: int

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            settings.warmup_max_inflight,
            settings.warmup_max_waiting,
            settings.warmup_max_proxy_inflight,
        )


def skip_reason(
    limits: Limits, *, session_busy: bool, warming: int, proxy_in_flight: float
) -> str | None:
    """Why a warm-up must not go now as far as the proxy can tell, or None. Judged on the
    request's task, from numbers held in memory."""
    if session_busy:
        return "session_busy"
    if warming >= limits.max_inflight:
        return "global_cap"
    if proxy_in_flight > limits.max_proxy_inflight:
        return "proxy_busy"
    return None


def engine_busy(limits: Limits, waiting: int | None) -> bool:
    """Whether the engine queues more requests than warm-ups may add to. One that does not
    say (``None``: not vLLM, no metrics) is taken as idle."""
    return waiting is not None and waiting > limits.max_waiting


def timed_skip(recomputed: Sequence[bool], missed: Sequence[bool], skipped: int) -> str | None:
    """Why a timed warm-up is not worth sending, or None: given whether the engine's recent
    timed warm-ups had to recompute evicted blocks, whether their steps then missed what
    they warmed (each oldest first), and how many were skipped since the last one went. One
    in PROBE_EVERY goes all the same, so the reading stays fresh when things change."""
    if len(recomputed) >= CACHED_STREAK and not any(recomputed[-CACHED_STREAK:]):
        reason = "still_cached"
    elif thrashing(missed):
        reason = "evicted_before_use"
    else:
        return None
    return None if skipped + 1 >= PROBE_EVERY else reason


def saturated(queued_share: float) -> bool:
    """Whether the engine is too busy for warm-ups to pay."""
    return queued_share >= SATURATED_SHARE


def thrashing(missed: Sequence[bool]) -> bool:
    """Whether the engine's recent timed warm-ups were mostly evicted again before their
    step came (``missed``, oldest first): then the warm-up right after a reply is skipped
    too (its blocks go the same way) and only timed probes go."""
    return len(missed) >= CACHED_STREAK and sum(missed) >= WASTED_SHARE * len(missed)


def short_rounds(gaps: Sequence[float]) -> bool:
    """Whether the session's last tool rounds (``gaps``, oldest first) were too short for
    a warm-up to pay: its client is back before LRU can evict what the reply just cached,
    and the warm-up right after the reply would run when the client's request arrives."""
    return len(gaps) >= SHORT_ROUNDS and max(gaps[-SHORT_ROUNDS:]) < MIN_TIMED_GAP_S


def irregular(gaps: Sequence[float]) -> bool:
    """Whether the session's recent tool rounds (``gaps``) vary too widely to aim a timed
    warm-up at: aimed at the shortest, it comes too early for the long ones, and their
    blocks are evicted again before the step (while taking other sessions' blocks)."""
    return len(gaps) >= 2 and max(gaps) > SPREAD_MAX * min(gaps)


def warm_delay(gaps: Sequence[float], recompute_s: float = 0.0) -> float | None:
    """Seconds after a tool-call reply to warm its prefix a second time, just before the
    client is expected back: the shortest of its recent tool rounds, less a lead (a tenth
    of the round within 0.2-2 s, or longer where recent warm-ups that recomputed evicted
    blocks took ``recompute_s``, but never half the round). None without history or when
    the client comes back too soon for it to matter."""
    if not gaps:
        return None
    expected = min(gaps)
    if expected < MIN_TIMED_GAP_S:
        return None
    lead = max(min(expected * LEAD_SHARE, MAX_LEAD_S), MIN_LEAD_S, RECOMPUTE_LEAD * recompute_s)
    return expected - min(lead, expected / 2)
