"""Summary math, grouping by step index, tables and the JSON document."""

from __future__ import annotations

import json

import pytest

from proxy.replay import report
from proxy.replay.records import StepRecord


def ok(conversation: str, step: int, prompt: int, cached: int, ttft: float) -> StepRecord:
    return StepRecord(conversation, step, 3 + step, prompt, cached, ttft, ttft * 2, 200)


def failed(conversation: str, step: int) -> StepRecord:
    return StepRecord(conversation, step, 3 + step, status=503, error="fake 503")


STEPS = [
    ok("a", 0, 1000, 0, 0.4),
    ok("a", 1, 1200, 992, 0.1),
    ok("a", 2, 1500, 1200, 0.2),
    ok("b", 0, 800, 512, 0.3),
    failed("b", 1),
    ok("b", 2, 1000, 800, 0.1),
]


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([], 0.5, None),
        ([3.0], 0.95, 3.0),
        ([1.0, 2.0, 3.0, 4.0], 0.5, 2.5),
        ([4.0, 1.0, 3.0, 2.0], 0.95, 3.85),  # linear between ranks, order of input irrelevant
        ([1.0, 2.0, 3.0, 4.0, 5.0], 0.5, 3.0),
        ([1.0, 2.0], 1.0, 2.0),
    ],
)
def test_percentile(values: list[float], q: float, expected: float | None) -> None:
    assert report.percentile(values, q) == pytest.approx(expected)


def test_summary() -> None:
    summary = report.summarize(STEPS, wall_s=3.5)
    assert summary["requests"] == 6
    assert summary["errors"] == 1
    assert summary["prompt_tokens"] == 5500
    assert summary["cached_tokens"] == 3504
    assert summary["computed_tokens"] == 1996
    assert summary["cached_share"] == pytest.approx(3504 / 5500)
    # Steps with index >= 1 that succeeded: a1, a2, b2.
    assert summary["cached_share_after_first_step"] == pytest.approx(2992 / 3700)
    assert summary["cached_share_from_step_2"] == pytest.approx(2000 / 2500)  # a2, b2
    assert summary["ttft_p50_s"] == pytest.approx(0.2)
    assert summary["ttft_p95_s"] == pytest.approx(0.38)
    assert summary["e2e_p50_s"] == pytest.approx(0.4)
    assert summary["wall_s"] == 3.5
    assert summary["without_usage"] == summary["without_cached_tokens"] == 0


def test_summary_of_nothing_measured() -> None:
    summary = report.summarize([failed("a", 0)], wall_s=0.1)
    assert summary["requests"] == summary["errors"] == 1
    assert summary["cached_share"] is None and summary["ttft_p50_s"] is None


def test_missing_usage_is_counted() -> None:
    steps = [
        StepRecord("a", 0, 2, None, None, 0.1, 0.2, 200),
        StepRecord("a", 1, 4, 100, None, 0.1, 0.2, 200),
    ]
    summary = report.summarize(steps, 1.0)
    assert (summary["without_usage"], summary["without_cached_tokens"]) == (1, 1)
    assert summary["prompt_tokens"] == 100 and summary["cached_tokens"] == 0


def test_steps_after_12_are_grouped_by_four() -> None:
    steps = [ok("a", i, 100, 50, 0.01 * i) for i in range(23)]
    groups = report.by_step(steps)
    labels = [group.label for group in groups.values()]
    assert labels == [str(i) for i in range(13)] + ["13-16", "17-20", "21-24"]
    assert groups[(13, 16)].requests == 4 and groups[(21, 24)].requests == 2
    assert groups[(13, 16)].ttft_p50_s == pytest.approx(0.145)
    assert len(report.by_step(steps, grouped=False)) == 23


def test_by_step_shares() -> None:
    groups = report.by_step(STEPS)
    assert groups[(0, 0)].cached_share == pytest.approx(512 / 1800)
    assert groups[(1, 1)].requests == 2  # the failed step counts as a request
    assert groups[(1, 1)].cached_share == pytest.approx(992 / 1200)


def test_comparison_table_shows_the_difference() -> None:
    direct = report.summarize(STEPS, 3.5)
    proxied = {**direct, "cached_share": direct["cached_share"] + 0.1, "ttft_p50_s": 0.25}
    table = report.summary_table([("direct", direct), ("proxy", proxied)])
    lines = table.splitlines()
    assert lines[0] == "| metric | direct | proxy | proxy - direct |"
    assert lines[1] == "|---|---:|---:|---:|"
    row = {line.split(" | ")[0].lstrip("| "): line for line in lines[2:]}
    assert row["cached share"].endswith("| +10.0 pp |")
    assert row["TTFT p50"] == "| TTFT p50 | 200.0 ms | 250.0 ms | +50.0 ms (+25.0%) |"
    assert row["requests"].endswith("| 6 | 6 | +0 (+0.0%) |")


def test_single_run_table_and_step_table() -> None:
    table = report.summary_table([("run", report.summarize(STEPS, 1.0))])
    assert table.splitlines()[0] == "| metric | run |"
    steps = report.step_table([("direct", STEPS), ("proxy", STEPS[:3])])
    lines = steps.splitlines()
    assert lines[0].startswith("| step | requests | TTFT p50 (direct) | cached share (direct)")
    assert lines[2] == "| 0 | 2 | 350.0 ms | 28.4% | 400.0 ms | 0.0% |"


def test_document_is_json() -> None:
    document = report.document(STEPS, report.summarize(STEPS, 1.0), {"profile": "faithful"})
    decoded = json.loads(json.dumps(document))
    assert decoded["steps"][4] == {
        "conversation": "b",
        "step": 1,
        "messages": 4,
        "prompt_tokens": None,
        "cached_tokens": None,
        "ttft_s": None,
        "e2e_s": None,
        "status": 503,
        "error": "fake 503",
        "compaction": None,
        "proxy_overhead_ms": None,
    }
    assert decoded["config"] == {"profile": "faithful"}
    assert decoded["summary"]["requests"] == 6
