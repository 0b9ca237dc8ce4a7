"""Client profiles: each one's effect, nothing else changed, deterministic, nothing mutated."""

from __future__ import annotations

import copy
import datetime
import itertools
import json
import re

import pytest

from proxy.replay import profiles, traces
from proxy.replay.profiles import Prompt
from tests.unit.test_replay_traces import DEV

CONVERSATIONS = traces.load(DEV)
STEPS = [s for c in CONVERSATIONS for s in traces.steps(c)]
CLOCK = re.compile(
    r"^Current date and time: (Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), "
    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC\n\n"
)


def prompt_of(step: traces.Step) -> Prompt:
    return Prompt(step.messages, step.conversation.tools)


def apply(name: str, step: traces.Step) -> Prompt:
    return profiles.PROFILES[name](prompt_of(step), step.conversation.id, step.index)


def dump(prompt: Prompt) -> bytes:
    return json.dumps([prompt.messages, prompt.tools]).encode()


@pytest.mark.parametrize("name", sorted(profiles.PROFILES))
def test_profiles_are_deterministic_and_leave_the_recording_alone(name: str) -> None:
    before = copy.deepcopy([c.messages for c in CONVERSATIONS[:8]])
    tools_before = copy.deepcopy([c.tools for c in CONVERSATIONS[:8]])
    for step in (s for s in STEPS if s.conversation in CONVERSATIONS[:8]):
        assert dump(apply(name, step)) == dump(apply(name, step))
    assert [c.messages for c in CONVERSATIONS[:8]] == before
    assert [c.tools for c in CONVERSATIONS[:8]] == tools_before


def test_faithful_sends_exactly_the_recording() -> None:
    for step in STEPS[:50]:
        assert dump(apply("faithful", step)) == dump(prompt_of(step))


def test_timestamped_changes_only_the_start_of_the_system_prompt() -> None:
    for step in STEPS:
        original, sent = prompt_of(step), apply("timestamped", step)
        assert sent.tools == original.tools
        assert sent.messages[1:] == original.messages[1:]
        system = sent.messages[0]["content"]
        match = CLOCK.match(system)
        assert match, system[:80]
        assert system[match.end() :] == original.messages[0]["content"]
        moment = datetime.datetime.strptime(match[2], "%Y-%m-%d %H:%M:%S")
        assert match[1] == moment.strftime("%A")  # the weekday agrees with the date


def test_timestamped_time_moves_on_every_step_of_a_conversation() -> None:
    conversation = CONVERSATIONS[0]
    moments = [profiles.virtual_now(conversation.id, i) for i in range(5)]
    assert [(b - a).total_seconds() for a, b in itertools.pairwise(moments)] == [47] * 4
    lines = [
        apply("timestamped", s).messages[0]["content"][:60] for s in traces.steps(conversation)
    ]
    assert len(set(lines)) == len(lines)
    # Another conversation starts at another moment of the day.
    assert profiles.virtual_now(CONVERSATIONS[1].id, 0) != moments[0]


def test_timestamped_adds_a_system_message_when_there_is_none() -> None:
    prompt = Prompt([{"role": "user", "content": "hi"}], [])
    sent = profiles.timestamped(prompt, "c", 0)
    assert sent.messages[0]["role"] == "system"
    assert sent.messages[0]["content"].startswith("Current date and time: ")
    assert sent.messages[1:] == prompt.messages


def tool_names(prompt: Prompt) -> list[str]:
    return [tool["function"]["name"] for tool in prompt.tools]


def test_reordered_tools_sends_the_same_tools_in_another_order_each_step() -> None:
    for conversation in CONVERSATIONS:
        orders = []
        for step in traces.steps(conversation):
            original, sent = prompt_of(step), apply("reordered-tools", step)
            assert sent.messages == original.messages
            assert sorted(tool_names(sent)) == sorted(tool_names(original))
            assert sorted(map(json.dumps, sent.tools)) == sorted(map(json.dumps, original.tools))
            orders.append(tuple(tool_names(sent)))
        # 14-15 tools: a repeated order in one conversation would be a bug, not bad luck.
        assert len(set(orders)) == len(orders)
        assert orders[0] != tuple(tool_names(Prompt([], conversation.tools)))


def calls(prompt: Prompt) -> list[str]:
    return [
        call["function"]["arguments"]
        for message in prompt.messages
        if message["role"] == "assistant"
        for call in message.get("tool_calls") or []
    ]


def test_reserialized_args_are_json_equal_but_byte_different() -> None:
    changed = same = 0
    for step in STEPS:
        original, sent = prompt_of(step), apply("reserialized-args", step)
        assert sent.tools == original.tools
        for before, after in zip(calls(original), calls(sent), strict=True):
            assert json.loads(after) == json.loads(before)
            value = json.loads(before)
            both_agree = json.dumps(value) == json.dumps(value, separators=(",", ":"))
            if both_agree:  # '{}': no other common form exists
                assert after == before
                same += 1
            else:
                assert after != before
                changed += 1
        stripped = [_without_calls(m) for m in sent.messages]
        assert stripped == [_without_calls(m) for m in original.messages]
    assert changed > 1000 and same < changed / 50


def _without_calls(message: dict) -> dict:
    return {k: v for k, v in message.items() if k != "tool_calls"}


@pytest.mark.parametrize(
    ("emitted", "sent"),
    [
        ('{"city": "Paris", "n": [1, 2]}', '{"city":"Paris","n":[1,2]}'),  # tau2 style
        ('{"city":"Paris"}', '{"city": "Paris"}'),  # compact, as gpt-4o emitted in tau-bench
        ('{"name":"Zoë"}', '{"name": "Zo\\u00eb"}'),
        ("not json", "not json"),
    ],
)
def test_reserialize_picks_the_other_style(emitted: str, sent: str) -> None:
    assert profiles.reserialize(emitted) == sent


def test_dropped_reasoning_removes_reasoning_from_assistant_messages_only() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q", "reasoning_content": "user field stays"},
        {"role": "assistant", "content": "a", "reasoning_content": "think"},
        {"role": "assistant", "content": None, "reasoning": "think", "tool_calls": []},
        {"role": "assistant", "content": "plain"},
    ]
    sent = profiles.dropped_reasoning(Prompt(messages, []), "c", 0).messages
    assert sent[:2] == messages[:2]
    assert sent[2] == {"role": "assistant", "content": "a"}
    assert sent[3] == {"role": "assistant", "content": None, "tool_calls": []}
    assert sent[4] is messages[4]
    assert "reasoning_content" in messages[2]  # the input is untouched


def test_dropped_reasoning_is_a_noop_on_the_traces_and_says_so() -> None:
    for step in STEPS[:100]:
        assert dump(apply("dropped-reasoning", step)) == dump(prompt_of(step))
    assert len(profiles.notes("dropped-reasoning", CONVERSATIONS)) == 1
    assert len(profiles.notes("mixed", CONVERSATIONS)) == 1
    assert profiles.notes("faithful", CONVERSATIONS) == []
    thinking = traces.parse(
        {"id": "t", "messages": [{"role": "assistant", "content": "", "reasoning_content": "x"}]}
    )
    assert profiles.notes("dropped-reasoning", [thinking]) == []


def test_mixed_applies_every_profile() -> None:
    step = next(s for s in STEPS if calls(prompt_of(s)) and s.index > 0)
    sent, original = apply("mixed", step), prompt_of(step)
    assert CLOCK.match(sent.messages[0]["content"])
    assert tool_names(sent) == tool_names(apply("reordered-tools", step))
    assert calls(sent) == calls(apply("reserialized-args", step))
    assert calls(sent) != calls(original)


def test_varied_clocks_change_every_step_in_every_format_and_position() -> None:
    from proxy.replay.profiles import CLOCK_FORMATS, CLOCK_POSITIONS, VariedClock, select

    system = "You are a support agent.\n\nAnswer in one paragraph."
    prompt = profiles.Prompt(
        [{"role": "system", "content": system}, {"role": "user", "content": "hi"}], []
    )
    for form in CLOCK_FORMATS:
        for position in CLOCK_POSITIONS:
            profile = select(f"clock:{form}:{position}")
            assert profile == VariedClock(form, position)
            first, second = (
                profile(prompt, "conv-1", step).messages[0]["content"] for step in (3, 4)
            )
            assert first != second, (form, position)
            for line in system.split("\n"):  # the prompt itself is all there, in order
                assert line in first
            if position == "top":
                assert first.endswith(system)
            elif position == "bottom":
                assert first.startswith(system)
    assert prompt.messages[0]["content"] == system  # the recorded prompt is not touched


def test_varied_clocks_cover_every_format_over_the_dev_traces() -> None:
    from proxy.replay.profiles import CLOCK_FORMATS, varied_clocks

    conversations = traces.load(traces.bundled("dev"))
    seen = set()
    for conversation in conversations:
        prompt = profiles.Prompt([{"role": "system", "content": "x"}], [])
        content = varied_clocks(prompt, conversation.id, 0).messages[0]["content"]
        seen |= {
            name
            for name, render in CLOCK_FORMATS.items()
            if render(profiles.virtual_now(conversation.id, 0), 0) in content
        }
    assert seen == set(CLOCK_FORMATS)
