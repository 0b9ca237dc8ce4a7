"""Each engine's reading of its timed warm-ups (proxy.warmup.ledger): kept per engine,
judged by the step each was for, bounded."""

from __future__ import annotations

from proxy.warmup import ledger
from proxy.warmup.ledger import TimedLedger
from proxy.warmup.policy import CACHED_STREAK, PROBE_EVERY


def test_engines_are_read_apart_and_a_probe_goes_after_skips() -> None:
    book = TimedLedger()
    for n in range(CACHED_STREAK):
        assert book.skip("a") is None
        book.warmed("a", recomputed=False, session=f"s{n}", tokens=0)
    assert [book.skip("a") for _ in range(PROBE_EVERY)] == ["still_cached"] * (PROBE_EVERY - 1) + [
        None
    ]
    assert book.skip("b") is None  # another engine: nothing known about it


def test_a_step_judges_the_timed_warmup_it_was_for_only() -> None:
    book = TimedLedger()
    for n in range(CACHED_STREAK):
        book.warmed("a", recomputed=True, session=f"s{n}", tokens=100)
        book.step(f"s{n}", 40)  # evicted again before the step: it found 40 of 100
        book.step(f"s{n}", 0)  # a later step of the same session: nothing to judge
    assert book.thrashing("a") and not book.thrashing("b")
    assert book.skip("a") == "evicted_before_use"
    kept = TimedLedger()
    for n in range(CACHED_STREAK):
        kept.warmed("a", recomputed=True, session=f"s{n}", tokens=100)
        kept.step(f"s{n}", 100)
    assert kept.skip("a") is None and not kept.thrashing("a")


def test_unjudged_warmups_age_out(monkeypatch) -> None:
    monkeypatch.setattr(ledger, "AWAITING_KEPT", 3)
    book = TimedLedger()

    def missed(session: str, cached: int | None = 0) -> None:
        book.warmed("a", recomputed=True, session=session, tokens=100)
        book.step(session, cached)

    for n in range(CACHED_STREAK):
        book.warmed("a", recomputed=True, session=f"old{n}", tokens=100)
    for n in range(CACHED_STREAK):
        book.step(f"old{n}", 0)  # only the newest 3 were still awaited: 3 judged
    for n in range(CACHED_STREAK - 4):
        missed(f"s{n}")
    missed("unknown", None)  # usage unknown: not judged
    book.step("unknown", 0)  # and forgotten
    assert book.skip("a") is None  # 7 judged: one short of a reading
    missed("last")
    assert book.skip("a") == "evicted_before_use"
