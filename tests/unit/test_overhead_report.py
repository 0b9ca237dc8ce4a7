"""The overhead benchmark's per-round ratio (tests/benchmarks/overhead.py)."""

from __future__ import annotations

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
