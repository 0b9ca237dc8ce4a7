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


def mode_result(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode of one cell as a --json file holds it (the figures pooled() sums or
    averages, zero here)."""
    from tests.benchmarks.warmup_matrix import SUMMED

    ttfts = [r["ttft_s"] for r in records]
    return {
        **dict.fromkeys(SUMMED, 0),
        "records": records,
        "p50": sorted(ttfts)[len(ttfts) // 2],
        "p95": max(ttfts),
        "cached_share": 0.8,
        "skips": {"still_cached": 1.0},
        "engine_idle": 0.3,
        "engine_compute": 0.1,
        "queued_share": [],
    }


def test_report_pools_a_cell_over_files_and_keeps_their_runs_apart() -> None:
    from tests.benchmarks.warmup_matrix import merged

    def cell(name: str, off_ttft: float) -> dict[str, Any]:
        off = [record(f"c{i}", 2, off_ttft, 4000) for i in range(10)]
        on = [record(f"c{i}", 2, 0.02, 4000) for i in range(10)]
        return {"cell": {"name": name}, "off": mode_result(off), "on": mode_result(on),
                "runs": [(off_ttft, 0.02, off_ttft, 0.02)]}  # fmt: skip

    first = [cell("a", 0.04), cell("b", 0.02)]
    second = [cell("a", 0.08)]  # the same run numbers in its file: paired within it
    pooled = {c["cell"]["name"]: c for c in merged([first, second])}
    assert pooled["b"] == first[1]  # in one file only: as it was
    a = pooled["a"]
    assert a["paired"]["pairs"] == 20 and len(a["off"]["records"]) == 20
    # Half the steps gained 2x, half 4x: paired across files, all would be one of them.
    low, high = a["paired"]["p50_ci"]
    assert 2.0 <= low < high <= 4.0
    assert a["runs"] == [(0.04, 0.02, 0.04, 0.02), (0.08, 0.02, 0.08, 0.02)]
    assert a["off"]["skips"] == {"still_cached": 2.0}
