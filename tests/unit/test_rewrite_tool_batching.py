"""Tool batching: parallel_tool_calls asked for where the client left it unset, and the
optional constant instruction appended to the system prompt once, prefix-stable."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import config
from proxy.app import default_transforms
from proxy.rewrite import Pipeline, RewriteContext
from proxy.rewrite.tool_batching import INSTRUCTION, NAME, SEPARATOR, tool_batching
from tests.support.conversations import any_conversations, conversations, texts_of

CONTEXT = RewriteContext()
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
SYSTEM = {"role": "system", "content": "You are a travel agent."}
USER = {"role": "user", "content": "Weather in Paris and Rome?"}
PARALLEL = tool_batching(parallel=True, instruction=False)
BOTH = tool_batching(parallel=True, instruction=True)
INSTRUCTION_ONLY = tool_batching(parallel=False, instruction=True)


def request(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [SYSTEM, USER], "tools": TOOLS, **fields}


@pytest.mark.parametrize("fields", [{}, {"parallel_tool_calls": None}])
def test_unset_parallel_tool_calls_is_asked_for(fields: dict[str, Any]) -> None:
    original = request(**fields)
    out = PARALLEL(original, CONTEXT)
    assert out == {**original, "parallel_tool_calls": True}
    assert original == request(**fields)  # the input is not mutated


@pytest.mark.parametrize("value", [False, True])
def test_the_clients_own_choice_is_kept(value: bool) -> None:
    assert PARALLEL(request(parallel_tool_calls=value), CONTEXT) is None


@pytest.mark.parametrize(
    "tools", [None, [], "get_weather", {"type": "function"}], ids=["absent", "empty", "str", "dict"]
)
def test_without_tools_nothing_changes(tools: Any) -> None:
    body = request(tools=tools) if tools is not None else {"model": "m", "messages": [USER]}
    assert BOTH(body, CONTEXT) is None


def test_both_switches_off_does_nothing_but_keeps_its_name() -> None:
    off = tool_batching(parallel=False, instruction=False)
    assert off.name == NAME
    assert off(request(), CONTEXT) is None


def test_instruction_is_appended_to_a_string_system_prompt() -> None:
    out = INSTRUCTION_ONLY(request(), CONTEXT)
    assert out is not None and "parallel_tool_calls" not in out
    assert out["messages"] == [
        {"role": "system", "content": SYSTEM["content"] + SEPARATOR + INSTRUCTION},
        USER,
    ]
    assert request()["messages"][0] == SYSTEM  # not mutated


def test_instruction_is_appended_once_whatever_comes_back() -> None:
    first = BOTH(request(), CONTEXT)
    assert first is not None
    assert BOTH(first, CONTEXT) is None  # idempotent
    # A client that sends the forwarded system prompt back, in a later step.
    echoed = request(messages=[first["messages"][0], USER, {"role": "assistant", "content": "ok"}])
    assert INSTRUCTION_ONLY(echoed, CONTEXT) is None


def test_instruction_goes_to_the_first_system_or_developer_message_only() -> None:
    developer = {"role": "developer", "content": "Be brief."}
    second = {"role": "system", "content": "Second."}
    out = INSTRUCTION_ONLY(request(messages=[developer, second, USER]), CONTEXT)
    assert out is not None
    assert out["messages"] == [
        {"role": "developer", "content": "Be brief." + SEPARATOR + INSTRUCTION},
        second,
        USER,
    ]


def test_instruction_as_one_more_content_part() -> None:
    parts = [{"type": "text", "text": "You are a travel agent."}]
    system = {"role": "system", "content": parts}
    out = INSTRUCTION_ONLY(request(messages=[system, USER]), CONTEXT)
    assert out is not None
    assert out["messages"][0] == {
        "role": "system",
        "content": [*parts, {"type": "text", "text": INSTRUCTION}],
    }
    assert system["content"] == parts and len(parts) == 1  # not mutated
    assert INSTRUCTION_ONLY(out, CONTEXT) is None


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("", INSTRUCTION),  # an empty system prompt gets the text alone
        (None, None),  # nothing to append to: left as it is
        (42, None),
        (f"Rules.\n{INSTRUCTION}\nMore rules.", None),  # the client wrote it already
    ],
)
def test_instruction_on_odd_system_content(content: Any, expected: Any) -> None:
    out = INSTRUCTION_ONLY(
        request(messages=[{"role": "system", "content": content}, USER]), CONTEXT
    )
    if expected is None:
        assert out is None
    else:
        assert out is not None and out["messages"][0]["content"] == expected


def test_without_a_system_message_no_instruction_is_invented() -> None:
    out = BOTH(request(messages=[USER]), CONTEXT)
    assert out == request(messages=[USER], parallel_tool_calls=True)


def test_the_default_pipeline_asks_for_parallel_calls_and_can_switch_it_off() -> None:
    body = request()
    on = Pipeline(default_transforms(config.Settings())).apply(copy.deepcopy(body), CONTEXT)
    assert on.request["parallel_tool_calls"] is True and NAME in on.applied
    assert on.request["messages"] == body["messages"]  # the instruction is off by default
    off = Pipeline(default_transforms(config.Settings()), disabled=[NAME])
    assert "parallel_tool_calls" not in off.apply(copy.deepcopy(body), CONTEXT).request


def test_the_instruction_keeps_each_step_a_prefix_of_the_next() -> None:
    """Invariant 5: step n+1's forwarded messages start with step n's plus its reply."""
    pipeline = Pipeline(default_transforms(config.Settings(batching_instruction=True)))
    reply = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
        ],
    }
    history: list[dict[str, Any]] = [SYSTEM, USER]
    sent = []
    for step in range(3):
        out = pipeline.apply(request(messages=copy.deepcopy(history)), CONTEXT).request
        sent.append(out["messages"])
        history += [reply, {"role": "tool", "tool_call_id": "c1", "content": f"sunny {step}"}]
    assert sent[0][0]["content"].endswith(INSTRUCTION)
    for before, after in itertools.pairwise(sent):
        assert after[: len(before) + 1] == [*before, reply]


@settings(max_examples=200, deadline=None)
@given(conversations(), st.booleans())
def test_never_loses_text_and_is_deterministic(messages: list[Any], parallel: bool) -> None:
    transform = tool_batching(parallel=parallel, instruction=True)
    body = request(messages=messages)
    original = copy.deepcopy(body)
    out = transform(body, CONTEXT)
    assert body == original
    assert transform(copy.deepcopy(original), CONTEXT) == out
    if out is not None:
        assert len(out["messages"]) == len(messages)
        produced = "\n".join(texts_of(out["messages"]))
        assert produced.count(INSTRUCTION) <= 1
        for text in texts_of(messages):
            assert text in produced
        assert transform(out, CONTEXT) is None  # a second pass has nothing to add


@settings(max_examples=200, deadline=None)
@given(any_conversations())
def test_malformed_messages_never_raise(messages: Any) -> None:
    BOTH(request(messages=messages), CONTEXT)
