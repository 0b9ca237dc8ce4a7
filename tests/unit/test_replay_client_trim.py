"""The client-trim profile: LangChain's trim_messages(strategy="last", include_system=True,
start_on="human") on the real traces: a valid conversation, within its budget, the same
messages LangChain keeps, and a start that only ever moves forward."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.replay import profiles, traces
from proxy.replay.profiles import ClientTrim, Prompt, message_tokens
from tests.unit.test_replay_traces import DEV

CONVERSATIONS = traces.load(DEV)
STEPS = [s for c in CONVERSATIONS for s in traces.steps(c)]
BUDGETS = (0, 500, 2_500, 4_096, 6_000, 100_000)


def trim(step: traces.Step, budget: int) -> list[dict[str, Any]]:
    prompt = Prompt(step.messages, step.conversation.tools)
    return ClientTrim(budget)(prompt, step.conversation.id, step.index).messages


def check_valid(kept: list[dict[str, Any]], sent: list[dict[str, Any]]) -> None:
    """The system prompt, then a contiguous tail of the history that starts on a user
    message; every tool result answers a call of the assistant message before it."""
    assert kept[0] is sent[0] and kept[0]["role"] == "system"
    history = kept[1:]
    if not history:
        return
    assert history[0]["role"] == "user"
    assert all(a is b for a, b in zip(history, sent[len(sent) - len(history) :], strict=True))
    calls: set[str] = set()
    for message in history:
        if message["role"] == "assistant":
            calls = {call["id"] for call in message.get("tool_calls") or ()}
        elif message["role"] == "tool":
            assert message["tool_call_id"] in calls
        else:
            calls = set()


@pytest.mark.parametrize("budget", BUDGETS)
def test_every_step_gives_a_valid_conversation_within_the_budget(budget: int) -> None:
    for step in STEPS:
        kept = trim(step, budget)
        check_valid(kept, step.messages)
        history = sum(map(message_tokens, kept[1:]))
        assert history + message_tokens(kept[0]) <= max(budget, message_tokens(kept[0]))


@settings(max_examples=200, deadline=None)
@given(step=st.sampled_from(STEPS), budget=st.integers(min_value=0, max_value=12_000))
def test_keeps_the_longest_tail_that_fits_then_starts_on_a_user_message(
    step: traces.Step, budget: int
) -> None:
    sent = step.messages
    kept = trim(step, budget)
    check_valid(kept, sent)
    room = budget - message_tokens(sent[0])
    fits = 0  # the longest tail of the history that fits
    while fits < len(sent) - 1 and sum(map(message_tokens, sent[-fits - 1 :])) <= room:
        fits += 1
    tail = sent[len(sent) - fits :]
    users = [k for k, message in enumerate(tail) if message["role"] == "user"]
    expected = tail[users[0] :] if users else []
    assert kept[1:] == expected


def test_same_as_langchain_trim_messages() -> None:
    messages_module = pytest.importorskip("langchain_core.messages")
    for step, budget in itertools.product(STEPS[::7], (1_500, 3_000, 4_096, 8_000)):
        sent = step.messages
        converted = []
        for index, message in enumerate(sent):
            (lc_message,) = messages_module.convert_to_messages([message])
            lc_message.id = str(index)
            converted.append(lc_message)
        counts = [message_tokens(message) for message in sent]
        trimmed = messages_module.trim_messages(
            converted,
            max_tokens=budget,
            token_counter=lambda batch, counts=counts: sum(counts[int(m.id)] for m in batch),
            strategy="last",
            include_system=True,
            start_on="human",
            allow_partial=False,
        )
        history = len(trim(step, budget)) - 1
        expected = [0, *range(len(sent) - history, len(sent))]
        assert [int(m.id) for m in trimmed] == expected, (step.conversation.id, budget)


def test_the_start_only_moves_forward_along_a_conversation() -> None:
    for conversation in CONVERSATIONS:
        starts = []
        for step in traces.steps(conversation):
            kept = trim(step, 2_500)
            starts.append(len(step.messages) - len(kept) + 1)
        assert starts == sorted(starts), conversation.id


def test_a_short_prompt_is_sent_as_it_is_unless_it_opens_with_an_assistant_message() -> None:
    for step in STEPS[:80]:
        kept = trim(step, 100_000)
        if step.messages[1]["role"] == "user":
            assert kept == step.messages
        else:  # tau2's injected greeting: start_on="human" drops it on every request
            assert kept == [step.messages[0], *step.messages[2:]]


def test_a_long_conversation_is_trimmed_and_tools_are_kept() -> None:
    step = max(STEPS, key=lambda s: len(s.messages))
    prompt = Prompt(step.messages, step.conversation.tools)
    sent = profiles.select("client-trim", trim_tokens=3_000)(prompt, "c", 0)
    assert len(sent.messages) < len(step.messages)
    assert sent.tools is prompt.tools


def test_select_sets_the_budget_of_client_trim_only() -> None:
    assert profiles.select("client-trim") is profiles.PROFILES["client-trim"]
    assert profiles.select("client-trim", trim_tokens=123) == ClientTrim(123)
    assert profiles.select("faithful", trim_tokens=123) is profiles.faithful
    assert profiles.PROFILES["client-trim"] == ClientTrim(profiles.TRIM_TOKENS)


def test_message_tokens_counts_text_calls_and_framing() -> None:
    empty = message_tokens({"role": "assistant", "content": None})
    text = message_tokens({"role": "assistant", "content": "hello world"})
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    called = message_tokens({"role": "assistant", "content": None, "tool_calls": [call]})
    parts = message_tokens({"role": "user", "content": [{"type": "text", "text": "hello world"}]})
    assert empty >= profiles.TOKENS_PER_MESSAGE
    assert text > empty and called > empty
    assert parts == message_tokens({"role": "user", "content": "hello world"})
