"""Fail-open events in the log (proxy.failopen): the first of a kind with its traceback,
then a line at most every interval, counting what it left out."""

from __future__ import annotations

import logging

import pytest

from proxy.failopen import FailOpenLog
from tests.support.clock import Clock


def test_the_first_of_a_kind_has_its_traceback_then_lines_are_rate_limited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock(0.0)
    failures = FailOpenLog(logging.getLogger("test.failopen"), interval=60, clock=clock)
    with caplog.at_level(logging.WARNING, logger="test.failopen"):
        for _ in range(100):
            failures.failed("rewrite move_volatile", ValueError("bad part"))
        clock.now = 61
        failures.failed("rewrite move_volatile", ValueError("bad part"))
        failures.failed("rewrite canonical_tools", KeyError("x"))  # another kind
    records = caplog.records
    assert [r.exc_info is not None for r in records] == [True, False, True]
    assert "ValueError: bad part" in records[0].getMessage()
    assert "and 99 more since the last line" in records[1].getMessage()
    assert all(r.levelno == logging.WARNING for r in records)


def test_every_traceback_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    failures = FailOpenLog(logging.getLogger("test.failopen.debug"), clock=Clock(0.0))
    with caplog.at_level(logging.DEBUG, logger="test.failopen.debug"):
        for _ in range(3):
            failures.failed("session save", OSError("down"))
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(debug) == 2 and all(r.exc_info for r in debug)
