"""The share of recent time an engine spent bringing client requests to their first token
(proxy.warmup.load): overlapping requests count once, the window moves, engines apart."""

from __future__ import annotations

import pytest

from proxy.warmup import load
from proxy.warmup.load import MIN_SEEN_S, WINDOW_S, PrefillLoad
from proxy.warmup.policy import SATURATED_SHARE, saturated


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def fresh_readings(monkeypatch) -> None:
    monkeypatch.setattr(load, "MAX_AGE_S", 0.0)  # every reading computed anew


def test_overlapping_waits_count_once_and_engines_apart() -> None:
    clock = Clock()
    reading = PrefillLoad(clock)
    assert reading.share("a") == 0.0
    reading.add("a", 970.0, 976.0)
    reading.add("a", 972.0, 974.0)  # within the first: the engine was busy anyway
    reading.add("a", 975.0, 978.0)  # overlaps its end
    reading.add("b", 990.0, 991.0)
    assert reading.share("a") == pytest.approx(8.0 / WINDOW_S)
    assert reading.share("b") == pytest.approx(1.0 / 10.0)  # seen for 10 s only


def test_an_engine_seen_briefly_reads_over_the_time_seen() -> None:
    clock = Clock()
    reading = PrefillLoad(clock)
    reading.add("a", 997.0, 999.0)  # 3 s seen: too short to tell
    assert reading.share("a") == 0.0
    clock.now += MIN_SEEN_S - 3.0
    assert reading.share("a") == pytest.approx(2.0 / MIN_SEEN_S)


def test_the_window_moves_on() -> None:
    clock = Clock()
    reading = PrefillLoad(clock)
    for n in range(30):  # one request a second, each waiting 0.8 s: saturated
        reading.add("a", 970.0 + n, 970.8 + n)
    assert reading.share("a") == pytest.approx(0.8)
    assert saturated(reading.share("a"))
    clock.now += 20.0  # then nothing for 20 s: 10 s of the window still holds the waits
    assert reading.share("a") == pytest.approx(8.0 / WINDOW_S)
    assert not saturated(reading.share("a"))
    clock.now += WINDOW_S
    assert reading.share("a") == 0.0


def test_a_reading_is_reused_for_a_moment(monkeypatch) -> None:
    monkeypatch.setattr(load, "MAX_AGE_S", 1.0)
    clock = Clock()
    reading = PrefillLoad(clock)
    reading.add("a", 970.0, 975.0)
    first = reading.share("a")
    reading.add("a", 980.0, 1000.0)
    assert reading.share("a") == first == pytest.approx(5.0 / WINDOW_S)
    clock.now += 1.0
    assert reading.share("a") == pytest.approx((4.0 + 20.0) / WINDOW_S)


def test_saturated_from_the_threshold() -> None:
    assert saturated(SATURATED_SHARE) and not saturated(SATURATED_SHARE - 0.01)
