"""The overhead benchmark's per-round ratio and goals table (tests/benchmarks/overhead.py)."""

from __future__ import annotations

import itertools
import json

from tests.benchmarks.overhead import goals, round_ratios


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


def _row(target: str, size: str, mode: str, c: int, added: float, cpu: float = 1.0) -> dict:
    metric = "TTFT" if mode == "stream" else "full response"
    proxy = {"cpu_ms_per_request": cpu}
    return {
        "target": target,
        "size": size,
        "mode": mode,
        "concurrency": c,
        "metric": metric,
        "added_p50_ms": added,
        "proxy": proxy,
    }


def _goal_lines(rows: list[dict], env: dict | None = None) -> dict[str, str]:
    table = goals(rows, env or {})
    return {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()[2:]}


def test_goals_judge_each_goal_on_the_run_cells() -> None:
    rows = [
        _row("passthrough", "64k", "non-stream", 1, 0.70),
        _row("proxy", "64k", "non-stream", 1, 0.84, cpu=1.0),  # 1.20x
        _row("passthrough", "1m", "non-stream", 1, 2.00),
        _row("proxy", "1m", "non-stream", 1, 3.20, cpu=4.5),  # 1.60x, over 3 ms, 4.5x the CPU
        _row("passthrough", "64k", "non-stream", 64, 10.0),
        _row("proxy", "64k", "non-stream", 64, 19.0),  # 1.90x
    ]
    env = {"idle_resident_mb": {"proxy": 300.0, "passthrough": 100.0}, "session_state_mb": 200.0}
    lines = _goal_lines(rows, env)
    assert lines["c=1: added p50 within 1.5x of the passthrough's"].endswith(
        "64k non-stream 1.20x, 1m non-stream 1.60x | no |"
    )
    assert lines["1 MB, c=1: added p50 under 3 ms"].endswith("non-stream 3.20 ms | no |")
    assert lines["64 KB, c=64: added p50 within 2x of the passthrough's"].endswith(
        "non-stream 1.90x | yes |"
    )
    assert lines["CPU per request at 1 MB under 4x that at 64 KB"].endswith(
        "non-stream 4.50x | no |"
    )
    memory = "idle resident memory within 1.3x of the passthrough's + session state"
    assert lines[memory].endswith("| 1.00x | yes |")


def test_goals_without_a_reference_to_divide_by_are_not_met() -> None:
    rows = [_row("passthrough", "64k", "stream", 64, -0.4), _row("proxy", "64k", "stream", 64, 9.0)]
    line = _goal_lines(rows)["64 KB, c=64: added p50 within 2x of the passthrough's"]
    assert line.endswith("| stream - | no |")


def test_goals_leave_out_what_the_run_did_not_measure() -> None:
    # No passthrough: no ratio goals. A stream is judged by its first token, not its end.
    assert goals([_row("proxy", "2msg", "stream", 1, 0.5)], {}) == ""
    full_stream = {**_row("proxy", "1m", "stream", 1, 9.0), "metric": "full stream"}
    lines = _goal_lines([_row("proxy", "1m", "stream", 1, 2.0), full_stream])
    assert list(lines) == ["1 MB, c=1: added p50 under 3 ms"]
    assert lines["1 MB, c=1: added p50 under 3 ms"].endswith("| stream 2.00 ms | yes |")
