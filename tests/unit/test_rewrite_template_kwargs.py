"""Template kwargs that carry the date are pinned to the session's first-seen values;
switches such as ``enable_thinking`` are the client's to change."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import jsonio
from proxy.rewrite import RewriteContext
from proxy.rewrite.detector import DEFAULT_DETECTOR, VolatileDetector
from proxy.rewrite.template_kwargs import pin_template_kwargs, pinnable
from proxy.sessions import Session
from tests.support.conversations import any_conversations, conversations, is_valid_conversation


def context(pinned, volatile=None) -> RewriteContext:
    session = Session("s", pinned_template_kwargs=dict(pinned or {}))
    return RewriteContext(session=session, volatile=volatile)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"date_string": "29 Nov 2026"}, {"date_string": "29 Nov 2026"}),
        (
            {"current_date": "x", "today": 1, "now": None},
            {"current_date": "x", "today": 1, "now": None},
        ),
        ({"enable_thinking": False, "reasoning_effort": "high"}, {}),
        ({"enable_thinking": "2026-11-29", "thinking": "10:15:42"}, {}),
        (
            {"custom_clock": "2026-11-29T10:15:42Z", "style": "terse"},
            {"custom_clock": "2026-11-29T10:15:42Z"},
        ),
        ({"nested": {"date": "2026-11-29"}}, {}),  # only string values are inspected
        (None, {}),
        ("date_string", {}),
        ([("date_string", "x")], {}),
    ],
)
def test_pinnable(kwargs, expected) -> None:
    assert pinnable(kwargs, DEFAULT_DETECTOR) == expected


@pytest.mark.parametrize(
    ("kwargs", "pinned", "expected"),
    [
        (  # Llama 3.x: the date the session started with, not today's
            {"date_string": "30 Nov 2026", "enable_thinking": True},
            {"date_string": "29 Nov 2026"},
            {"date_string": "29 Nov 2026", "enable_thinking": True},
        ),
        (
            {"custom_clock": "2026-11-30T00:00:01Z", "style": "b"},
            {"custom_clock": "2026-11-29T23:59:58Z", "style": "a"},
            {"custom_clock": "2026-11-29T23:59:58Z", "style": "b"},
        ),
        (  # thinking switched off by the client stays off, even if something pinned it
            {"enable_thinking": False},
            {"enable_thinking": True},
            None,
        ),
        ({"date_string": "29 Nov 2026"}, {"date_string": "29 Nov 2026"}, None),  # same
        ({"today": True}, {"today": 1}, {"today": 1}),  # equal in Python, not in a template
        ({"enable_thinking": True}, {"date_string": "29 Nov 2026"}, None),  # never added
        ({"date_string": "30 Nov 2026"}, {}, None),  # nothing pinned yet
        ({"date_string": "30 Nov 2026"}, None, None),
        ("date_string", {"date_string": "29 Nov 2026"}, None),
        (None, {"date_string": "29 Nov 2026"}, None),
    ],
)
def test_pin(kwargs, pinned, expected) -> None:
    request = {"model": "m", "messages": [], "chat_template_kwargs": kwargs}
    before = copy.deepcopy(request)
    out = pin_template_kwargs(request, context(pinned))
    assert request == before
    assert out == (None if expected is None else {**request, "chat_template_kwargs": expected})


def test_the_detector_comes_from_the_context() -> None:
    detector = VolatileDetector((r"build [0-9a-f]{7}",))
    request = {"chat_template_kwargs": {"banner": "build 3f2a9c1"}}
    pinned = {"banner": "build 0000000"}
    assert pin_template_kwargs(request, context(pinned)) is None
    out = pin_template_kwargs(request, context(pinned, detector))
    assert out == {"chat_template_kwargs": pinned}


def test_a_context_without_a_session_changes_nothing() -> None:
    request = {"chat_template_kwargs": {"date_string": "30 Nov 2026"}}
    assert pin_template_kwargs(request, RewriteContext()) is None


_value = st.one_of(
    st.none(), st.booleans(), st.integers(), st.sampled_from(["29 Nov 2026", "10:15:42", "x"])
)
_kwargs = st.dictionaries(
    st.sampled_from(["date_string", "today", "enable_thinking", "clock", "style"]),
    _value,
    max_size=4,
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(_kwargs, _value), st.one_of(_kwargs, st.none()), any_conversations())
def test_never_raises_never_mutates_deterministic(kwargs, pinned, messages) -> None:
    request = {"messages": messages, "chat_template_kwargs": kwargs}
    before = copy.deepcopy(request)
    out = pin_template_kwargs(request, context(pinned))
    assert request == before
    assert jsonio.dumps(out) == jsonio.dumps(pin_template_kwargs(request, context(pinned)))
    if out is not None:
        assert out["messages"] is messages
        assert set(out["chat_template_kwargs"]) == set(kwargs)
        changed = {k for k in kwargs if out["chat_template_kwargs"][k] is not kwargs[k]}
        assert changed <= set(pinnable(kwargs, DEFAULT_DETECTOR))
        assert "enable_thinking" not in changed
        assert pin_template_kwargs(out, context(pinned)) is None


@settings(max_examples=50, deadline=None)
@given(_kwargs, _kwargs, conversations())
def test_valid_stays_valid(kwargs, pinned, messages) -> None:
    out = pin_template_kwargs(
        {"messages": messages, "chat_template_kwargs": kwargs}, context(pinned)
    )
    assert is_valid_conversation((out or {"messages": messages})["messages"])
