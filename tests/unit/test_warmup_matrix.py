"""The warm-up matrix's paired figures (pure: records in, figures out)."""

from __future__ import annotations

from typing import Any

from tests.benchmarks.warmup_matrix import paired


def record(conversation: str, step: int, ttft: float, cached: int, run: int = 0) -> dict[str, Any]:
    return {
        "conversation": conversation,
        "step": step,
        "run": run,
        "ttft_s": ttft,
        "prompt_tokens": 5000,
        "cached_tokens": cached,
    }


def test_pairs_are_the_same_step_and_the_interval_brackets_the_gain() -> None:
    off = [record(f"c{i}", s, 0.04 + 0.001 * i, 4000) for i in range(30) for s in (2, 3)]
    on = [record(f"c{i}", s, (0.04 + 0.001 * i) / 2, 4000) for i in range(30) for s in (2, 3)]
    figures = paired({"records": off}, {"records": list(reversed(on))})
    assert figures["pairs"] == 60
    assert figures["p50_ci"] == (2.0, 2.0) and figures["p95_ci"] == (2.0, 2.0)
    assert (figures["cached_more"], figures["cached_less"]) == (0, 0)


def test_steps_that_cached_more_or_less_are_counted_and_runs_kept_apart() -> None:
    off = [record("a", 2, 0.1, 1000), record("b", 2, 0.1, 4000), record("a", 2, 0.1, 4000, run=1)]
    on = [record("a", 2, 0.03, 4000), record("b", 2, 0.2, 1000), record("a", 2, 0.1, 3990, run=1)]
    figures = paired({"records": off}, {"records": on})
    assert (figures["pairs"], figures["cached_more"], figures["cached_less"]) == (3, 1, 1)
    low, high = figures["p50_ci"]
    assert low <= 1.0 <= high  # one step won, one lost: no gain either way is ruled out


def test_a_step_missing_in_one_mode_is_left_out() -> None:
    off = [record("a", 2, 0.1, 4000), record("b", 2, 0.1, 4000)]
    on = [record("a", 2, 0.1, 4000), {**record("b", 2, 0.1, 4000), "ttft_s": None}]
    assert paired({"records": off}, {"records": on}) == {
        "pairs": 1,
        "cached_more": 0,
        "cached_less": 0,
    }
