"""The overhead benchmark's per-round ratio (tests/benchmarks/overhead.py)."""

from __future__ import annotations

import itertools
import json

from tests.benchmarks.overhead import round_ratios


def test_round_ratios_pair_each_round_with_its_own_reference() -> None:
    # Pooled, a slow round's 4.0 against a fast one's 1.0 would read as 2x or 0.5x; each
    # round against its own reference is 1.5x, whatever the machine's speed.
    assert round_ratios([1.0, 4.0, 2.0], [1.5, 6.0, 3.0]) == "1.50x (1.50 .. 1.50)"


def test_round_ratios_median_and_range() -> None:
    assert round_ratios([1.0, 1.0, 1.0, 1.0], [1.0, 2.0, 3.0, 5.0]) == "2.50x (1.00 .. 5.00)"
    assert round_ratios([2.0, 1.0, 1.0], [1.0, 3.0, 1.5]) == "1.50x (0.50 .. 3.00)"


def test_round_ratios_without_a_reference_to_divide_by() -> None:
    assert round_ratios([1.0, -0.5, 2.0], [1.0, 1.0, 1.0]) == "-"
    assert round_ratios([], []) == "-"


def test_sessions_that_send_replies_back_grow_from_their_first_message() -> None:
    from tests.benchmarks.overhead import AgentSessions

    sessions = AgentSessions(8 * 1024, False, 600, per_session=4, replies_back="exact")
    bodies = [sessions.body(0, n) for n in range(sessions.session_length)]
    assert json.loads(bodies[0])["messages"][-1]["role"] == "user"  # the task alone
    for before, after in itertools.pairwise(bodies):
        assert after.startswith(before[:-2])  # each continues the one before
    assert [sessions.timed(n) for n in range(sessions.session_length)] == [False] * (
        sessions.base + 1
    ) + [True] * 3
    assert sessions.body(0, sessions.session_length) == sessions.body(0, 0).replace(b"0-0", b"0-1")
