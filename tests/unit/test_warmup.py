"""Warm-up decisions and request shapes (pure): block truncation, skips, timing, bodies."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.warmup.policy import (
    CACHED_STREAK,
    OUTCOMES_KEPT,
    PROBE_EVERY,
    Limits,
    engine_busy,
    irregular,
    short_rounds,
    skip_reason,
    timed_skip,
    warm_delay,
)
from proxy.warmup.shape import (
    chat_body,
    completion_body,
    route_missing,
    tokenize_body,
    warm_length,
)


@pytest.mark.parametrize(
    ("count", "block", "sent"),
    [
        (0, 16, 0),
        (1, 16, 0),
        (16, 16, 0),  # one full block, but its last token is always recomputed
        (17, 16, 17),
        (18, 16, 17),
        (32, 16, 17),
        (33, 16, 33),
        (2728, 32, 2721),  # measured on vLLM: 2,720 cached by the next step
        (2721, 32, 2721),
    ],
)
def test_warm_length(count: int, block: int, sent: int) -> None:
    assert warm_length(count, block) == sent


@given(st.integers(0, 200_000), st.sampled_from([1, 16, 32, 128, 256]))
def test_warm_length_caches_every_block_the_whole_prompt_would(count: int, block: int) -> None:
    sent = warm_length(count, block)
    best = max(count - 1, 0) // block * block  # what vLLM caches of the whole prompt
    if best == 0:
        assert sent == 0
    else:
        assert sent == best + 1 <= count  # those blocks, and the one token vLLM computes


LIMITS = Limits(max_inflight=4, max_waiting=0, max_proxy_inflight=64)


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        ({}, None),
        ({"session_busy": True, "warming": 4, "proxy_in_flight": 100}, "session_busy"),
        ({"warming": 4, "proxy_in_flight": 100}, "global_cap"),
        ({"warming": 3}, None),
        ({"proxy_in_flight": 65}, "proxy_busy"),
        ({"proxy_in_flight": 64}, None),
    ],
)
def test_skip_reason(state: dict, reason: str | None) -> None:
    arguments = {"session_busy": False, "warming": 0, "proxy_in_flight": 1} | state
    assert skip_reason(LIMITS, **arguments) == reason


@pytest.mark.parametrize(
    ("waiting", "busy"),
    [(None, False), (0, False), (1, True), (7, True)],  # None: the engine does not say
)
def test_engine_busy(waiting: int | None, busy: bool) -> None:
    assert engine_busy(LIMITS, waiting) is busy
    assert engine_busy(Limits(4, max_waiting=8, max_proxy_inflight=64), waiting) is False


def test_a_cap_of_zero_skips_every_warmup() -> None:
    limits = Limits(max_inflight=0, max_waiting=0, max_proxy_inflight=64)
    assert skip_reason(limits, session_busy=False, warming=0, proxy_in_flight=0) == "global_cap"


@pytest.mark.parametrize(
    ("gaps", "delay"),
    [
        ([], None),  # no history: only the warm-up right after the reply
        ([0.5], None),  # back too soon for a second one to matter
        ([2.0], 1.8),  # a tenth of the round ahead
        ([3.0, 2.0, 4.0], 1.8),  # the shortest recent round
        ([5.0], 4.5),
        ([1.0], 0.8),  # at least 0.2 s ahead
        ([40.0], 38.0),  # at most 2 s ahead
    ],
)
def test_warm_delay(gaps: list[float], delay: float | None) -> None:
    assert warm_delay(gaps) == (pytest.approx(delay) if delay is not None else None)


@pytest.mark.parametrize(
    ("gaps", "short"),
    [
        ([], False),  # no round seen yet
        ([0.4], True),
        ([5.0, 3.0, 0.4], True),  # the last one
        ([0.4, 1.0], False),
        ([0.5, 3.0], False),
    ],
)
def test_short_rounds(gaps: list[float], short: bool) -> None:
    assert short_rounds(gaps) is short


@pytest.mark.parametrize(
    ("gaps", "spread"),
    [
        ([], False),
        ([9.0], False),  # one round: nothing to compare
        ([2.0, 6.0], False),  # three times the shortest: still aimed
        ([2.0, 6.5], True),
        ([8.0, 1.5, 5.0, 4.0], True),  # an agent whose tools vary (0.5-10 s)
        ([5.0, 5.4, 4.8, 5.1], False),
    ],
)
def test_irregular_rounds(gaps: list[float], spread: bool) -> None:
    assert irregular(gaps) is spread


@pytest.mark.parametrize(
    ("gaps", "recompute_s", "delay"),
    [
        ([5.0], 0.1, 4.5),  # a fast engine: a tenth of the round is lead enough
        ([5.0], 1.0, 4.0),  # a recompute takes 1 s: start 1 s ahead
        ([40.0], 3.0, 37.0),  # past the 2 s cap when the engine needs it
        ([5.0], 10.0, 2.5),  # never more than half the round ahead
    ],
)
def test_the_lead_leaves_room_for_a_slow_engine(
    gaps: list[float], recompute_s: float, delay: float
) -> None:
    assert warm_delay(gaps, recompute_s) == pytest.approx(delay)


USER = {"role": "user", "content": "hi"}
REQUEST: dict = {
    "model": "m",
    "messages": [USER],
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "chat_template_kwargs": {"enable_thinking": False},
    "stream": True,
    "stream_options": {"include_usage": True},
    "temperature": 0.3,
    "x_replay_reply": {"role": "assistant", "content": "x"},
}
MESSAGES = [USER, {"role": "assistant", "content": None, "tool_calls": []}]


def test_timed_warmups_stop_while_they_keep_finding_their_prefix_cached() -> None:
    cached = [False] * CACHED_STREAK
    assert all(timed_skip(cached[:n], [], 0) is None for n in range(CACHED_STREAK))  # unknown
    # After a streak of cached ones, one in PROBE_EVERY goes.
    assert [timed_skip(cached, [], skipped) for skipped in range(PROBE_EVERY)] == [
        "still_cached"
    ] * (PROBE_EVERY - 1) + [None]
    # One that had to recompute evicted blocks in the streak: pressure, every one goes.
    for position in range(CACHED_STREAK):
        recomputed = [k == position for k in range(CACHED_STREAK)]
        assert timed_skip(recomputed, [], 0) is None
    # Only the latest streak counts.
    assert timed_skip([True, *cached], [], 0) == "still_cached"


def test_timed_warmups_stop_while_half_of_them_are_evicted_before_their_step() -> None:
    recomputing = [True] * CACHED_STREAK
    half = [k % 2 == 0 for k in range(OUTCOMES_KEPT)]
    assert timed_skip(recomputing, half, 0) == "evicted_before_use"
    assert timed_skip(recomputing, half, PROBE_EVERY - 1) is None  # the probe
    fewer = [k % 3 == 0 for k in range(OUTCOMES_KEPT)]  # a third missed: they mostly pay
    assert timed_skip(recomputing, fewer, 0) is None
    assert timed_skip(recomputing, [True] * (CACHED_STREAK - 1), 0) is None  # too few known


def test_tokenize_body_renders_the_conversation_as_the_next_request_will_start() -> None:
    assert tokenize_body(REQUEST, MESSAGES) == {
        "model": "m",
        "tools": REQUEST["tools"],
        "chat_template_kwargs": {"enable_thinking": False},
        "messages": MESSAGES,
        "add_generation_prompt": False,
        "continue_final_message": False,
    }


def test_completion_body_sends_token_ids_for_one_token() -> None:
    assert completion_body(REQUEST, [1, 2, 3], priority=0) == {
        "model": "m",
        "prompt": [1, 2, 3],
        "max_tokens": 1,
    }
    salted = completion_body({**REQUEST, "cache_salt": "tenant-7"}, [1], priority=5)
    assert salted["cache_salt"] == "tenant-7" and salted["priority"] == 5


def test_chat_body_is_the_same_prompt_without_a_generation_prompt() -> None:
    body = chat_body({**REQUEST, "cache_salt": "s"}, MESSAGES, priority=0)
    assert body == {
        "model": "m",
        "tools": REQUEST["tools"],
        "chat_template_kwargs": {"enable_thinking": False},
        "messages": MESSAGES,
        "add_generation_prompt": False,
        "max_tokens": 1,
        "stream": False,
        "cache_salt": "s",
    }


@pytest.mark.parametrize(
    ("status", "body", "missing"),
    [
        (404, b'{"detail":"Not Found"}', True),  # FastAPI's router: no such route
        (405, b'{"detail":"Method Not Allowed"}', True),
        (404, b"not json", True),
        (404, b'{"error":{"message":"The model `x` does not exist.","code":404}}', False),
        (500, b'{"detail":"Not Found"}', False),
        (200, b"{}", False),
    ],
)
def test_route_missing(status: int, body: bytes, missing: bool) -> None:
    assert route_missing(status, body) is missing
