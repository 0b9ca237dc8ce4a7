"""Volatile lines of the system prompt moved to a note at the tail: what is found, where it
goes, that nothing is lost, and that the timestamped replay profile becomes byte-stable."""

from __future__ import annotations

import copy
import re

import pytest
from hypothesis import given, settings

from proxy import jsonio
from proxy.replay import profiles, traces
from proxy.replay.profiles import Prompt
from proxy.rewrite import RewriteContext
from proxy.rewrite.detector import DEFAULT_DETECTOR, PLACEHOLDER, VolatileDetector
from proxy.rewrite.volatile import NOTE_HEADER, move_volatile, note_for
from tests.support.conversations import (
    any_conversations,
    conversations,
    is_valid_conversation,
    requests,
    texts_of,
)
from tests.unit.test_replay_traces import DEV

CONTEXT = RewriteContext()
CONVERSATIONS = traces.load(DEV)


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("Sunday, 2026-11-29 10:15:42 UTC", PLACEHOLDER),
        (
            "Current date and time: Sunday, 2026-11-29 10:15:42 UTC",
            f"Current date and time: {PLACEHOLDER}",
        ),
        ("2026-11-29", PLACEHOLDER),
        ("2026-11-29T10:15:42Z", PLACEHOLDER),
        ("2026-11-29T10:15:42.123456+01:00", PLACEHOLDER),
        ("2026-11-29 10:15", PLACEHOLDER),
        ("November 29, 2026", PLACEHOLDER),
        ("Nov 29th, 2026 at 10:15 AM", PLACEHOLDER),
        ("29 Nov 2026", PLACEHOLDER),
        ("11/29/2026", PLACEHOLDER),
        ("29.11.2026", PLACEHOLDER),
        ("Today is Sunday, November 29.", f"Today is {PLACEHOLDER}."),
        ("The current time is 2024-05-15 15:00:00 EST.", f"The current time is {PLACEHOLDER}."),
        ("trace 123e4567-E89B-12d3-a456-426614174000", f"trace {PLACEHOLDER}"),
        ("now=1764411342", f"now={PLACEHOLDER}"),
        ("now=1764411342123 ms", f"now={PLACEHOLDER} ms"),
        ("request id: abc123", f"request id: {PLACEHOLDER}"),
        ('Trace-ID="7f3a9c2b"', f'Trace-ID="{PLACEHOLDER}"'),
        # Deliberately left alone: no date or clock, or not clearly marked as an id.
        ("We are closed on Sunday.", None),
        ("May I help you?", None),
        ("Python 3.11.4, version 1.2.3", None),
        ("John 3:16, aspect 16:9", None),
        ("call 555-1234, order #1234567890, card 1234567890123456", None),
        ("model gpt-4-0613", None),
        ("port 8080, year 1999", None),
        ("the message id is required", None),
        ("user id: sara_doe_496", None),
        ("deadbeef-0000", None),
        # A time of day without its date: opening hours, format examples.
        ("open from 8:00 to 20:00", None),
        ('"02:30:00" means 2:30 AM EST.', None),
        ("at 10:15:42 sharp", None),
    ],
)
def test_what_the_detector_finds(text: str, masked: str | None) -> None:
    assert DEFAULT_DETECTOR.mask(text) == (text if masked is None else masked)
    assert DEFAULT_DETECTOR.finds(text) == (masked is not None)


def test_prompts_that_differ_only_in_volatile_values_mask_equal() -> None:
    step = traces.steps(CONVERSATIONS[0])
    prompts = [_timestamped(s).messages[0]["content"] for s in step[:5]]
    assert len(set(prompts)) == 5
    assert len({DEFAULT_DETECTOR.mask(p) for p in prompts}) == 1


def test_extra_patterns_come_from_settings() -> None:
    detector = VolatileDetector(("build (?P<value>[0-9a-f]{7})",))
    assert detector.mask("build 3f2a9c1 ok") == f"build {PLACEHOLDER} ok"
    assert detector.mask("2026-11-29") == PLACEHOLDER  # the built-in ones stay
    with pytest.raises(re.error):
        VolatileDetector(("(",))


@pytest.mark.parametrize(
    ("text", "stable", "moved"),
    [
        ("A\nB", "A\nB", []),
        (
            "Time: 2026-11-29 10:15:42\n\nYou are an agent.",
            "You are an agent.",
            ["Time: 2026-11-29 10:15:42"],
        ),
        ("A\n\nToday: 2026-11-29\n\nB", "A\n\nB", ["Today: 2026-11-29"]),
        ("A\nToday: 2026-11-29\nB", "A\nB", ["Today: 2026-11-29"]),
        ("A\nToday: 2026-11-29\n\nB", "A\n\nB", ["Today: 2026-11-29"]),
        ("2026-11-29\nabc\n\nA\n", "abc\n\nA\n", ["2026-11-29"]),
        ("A\r\nnow 2026-11-29 10:15:42\r\nB", "A\r\nB", ["now 2026-11-29 10:15:42\r"]),
        ("2026-11-29", "", ["2026-11-29"]),
    ],
)
def test_split_moves_whole_lines_and_their_blank_separator(
    text: str, stable: str, moved: list[str]
) -> None:
    assert DEFAULT_DETECTOR.split(text) == (stable, tuple(moved))


def test_the_note_format_is_fixed() -> None:
    assert note_for(["a", "b"]) == (
        "\n\n[Context moved from the system prompt: it changes on every request]\na\nb"
    )
    assert note_for([]).startswith("\n\n" + NOTE_HEADER)


CLOCK = "Current date and time: Sunday, 2026-11-29 10:15:42 UTC"
NOTE = note_for([CLOCK])
SYSTEM = {"role": "system", "content": f"{CLOCK}\n\nYou are an agent."}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        (  # the note goes to the last message when it is a user message
            [SYSTEM, {"role": "user", "content": "hi"}],
            [{**SYSTEM, "content": "You are an agent."}, {"role": "user", "content": "hi" + NOTE}],
        ),
        (  # ... or a tool result
            [
                SYSTEM,
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
            ],
            [
                {**SYSTEM, "content": "You are an agent."},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": None, "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "c1", "content": "42" + NOTE},
            ],
        ),
        (  # a trailing assistant message (prefill) is not the carrier: the last user is
            [SYSTEM, {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}],
            [
                {**SYSTEM, "content": "You are an agent."},
                {"role": "user", "content": "hi" + NOTE},
                {"role": "assistant", "content": "Sure"},
            ],
        ),
        (  # content parts: a part holding only the clock goes; the note is a new part
            [
                {
                    "role": "developer",
                    "content": [
                        {"type": "text", "text": CLOCK},
                        {"type": "text", "text": "Be brief."},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "hi"},
                        {"type": "image_url", "image_url": {"url": "x"}},
                    ],
                },
            ],
            [
                {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "hi"},
                        {"type": "image_url", "image_url": {"url": "x"}},
                        {"type": "text", "text": NOTE},
                    ],
                },
            ],
        ),
        (  # several system messages: lines collected in order
            [
                {"role": "system", "content": "A\nnow 2026-11-29 10:15:42"},
                {"role": "system", "content": "id 123e4567-e89b-12d3-a456-426614174000\nB"},
                {"role": "user", "content": "hi"},
            ],
            [
                {"role": "system", "content": "A"},
                {"role": "system", "content": "B"},
                {
                    "role": "user",
                    "content": "hi"
                    + note_for(
                        ["now 2026-11-29 10:15:42", "id 123e4567-e89b-12d3-a456-426614174000"]
                    ),
                },
            ],
        ),
    ],
)
def test_volatile_lines_move_to_the_newest_user_or_tool_message(messages, expected) -> None:
    request = {"model": "m", "messages": messages, "tools": []}
    before = copy.deepcopy(request)
    assert move_volatile(request, CONTEXT) == {**request, "messages": expected}
    assert request == before


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "hi"}],
        [SYSTEM],  # no message to carry the note
        [SYSTEM, {"role": "assistant", "content": "hello"}],
        [SYSTEM, {"role": "user", "content": None}],  # the carrier cannot take text
        [{"role": "user", "content": CLOCK}],  # other roles are never touched
        [{"role": "assistant", "content": CLOCK}, {"role": "user", "content": "hi"}],
        [
            {"role": "system", "content": [{"type": "text", "text": 5}, CLOCK]},
            {"role": "user", "content": "hi"},
        ],
    ],
)
def test_nothing_to_move_or_nowhere_to_put_it(messages) -> None:
    assert move_volatile({"model": "m", "messages": messages}, CONTEXT) is None


@pytest.mark.parametrize("messages", [None, "hi", 3, {"role": "user"}])
def test_malformed_requests_are_left_alone(messages) -> None:
    assert move_volatile({"messages": messages}, CONTEXT) is None
    assert move_volatile({}, CONTEXT) is None


def test_the_detector_comes_from_the_context() -> None:
    request = {
        "messages": [
            {"role": "system", "content": "build 3f2a9c1"},
            {"role": "user", "content": "hi"},
        ]
    }
    assert move_volatile(request, CONTEXT) is None
    context = RewriteContext(volatile=VolatileDetector((r"build [0-9a-f]{7}",)))
    moved = move_volatile(request, context)
    assert moved is not None
    assert moved["messages"][1]["content"] == "hi" + note_for(["build 3f2a9c1"])


def test_a_step_forwards_the_prompt_object_the_last_one_made() -> None:
    """The same system message object, with the same lines moved, gives the very object
    the previous step forwarded (its digests and encoding are found by identity); other
    lines moved out of it (a learned line), or another object, give a message of their
    own, with what the rewrite always gives."""
    step = {"messages": [SYSTEM, {"role": "user", "content": "hi"}]}
    first = move_volatile(step, CONTEXT)
    again = move_volatile({"messages": [SYSTEM, {"role": "user", "content": "go on"}]}, CONTEXT)
    assert first is not None and again is not None
    assert again["messages"][0] is first["messages"][0]
    assert first["messages"][0] == {"role": "system", "content": "You are an agent."}

    copied = {**SYSTEM}  # equal, but not the object the last step had
    other = move_volatile({"messages": [copied, {"role": "user", "content": "hi"}]}, CONTEXT)
    assert other is not None and other["messages"][0] is not first["messages"][0]
    assert other["messages"][0] == first["messages"][0]

    learned = RewriteContext(volatile=VolatileDetector((r"You are an agent\.",)))
    both = move_volatile(step, learned)
    assert both is not None and both["messages"][0]["content"] == ""
    assert move_volatile(step, CONTEXT) == first  # and back: the moved lines decide


def _timestamped(step: traces.Step) -> Prompt:
    prompt = Prompt(step.messages, step.conversation.tools)
    return profiles.timestamped(prompt, step.conversation.id, step.index)


@pytest.mark.parametrize("conversation", CONVERSATIONS[:20], ids=lambda c: c.id)
def test_timestamped_system_prompt_is_byte_stable_and_equal_to_faithful(conversation) -> None:
    systems = set()
    for step in traces.steps(conversation):
        sent = _timestamped(step).messages
        out = move_volatile({"messages": sent}, CONTEXT)
        faithful = move_volatile({"messages": step.messages}, CONTEXT) or {
            "messages": step.messages
        }
        assert out is not None
        system = out["messages"][0]
        assert system == faithful["messages"][0]
        systems.add(jsonio.dumps(system))
        # The clock is not lost: it is in the note, verbatim.
        assert (
            profiles.clock_line(profiles.virtual_now(conversation.id, step.index))
            in (texts_of(out["messages"])[-1])
        )
        assert out["messages"][1:-1] == faithful["messages"][1:-1]
    assert len(systems) == 1


# --- properties over generated conversations ---------------------------------------------


def _lines(texts: list[str]) -> list[str]:
    return [line for text in texts for line in text.split("\n")]


@settings(max_examples=300, deadline=None)
@given(requests(any_conversations()))
def test_never_raises_never_mutates_is_deterministic(request) -> None:
    before = copy.deepcopy(request)
    first = move_volatile(request, CONTEXT)
    assert request == before
    second = move_volatile(request, CONTEXT)
    assert jsonio.dumps(first) == jsonio.dumps(second)
    if first is not None:
        assert move_volatile(first, CONTEXT) is None  # moved once, nothing left to move


@settings(max_examples=300, deadline=None)
@given(requests(conversations()))
def test_valid_stays_valid_and_no_line_is_lost(request) -> None:
    assert is_valid_conversation(request["messages"])
    out = move_volatile(request, CONTEXT) or request
    assert is_valid_conversation(out["messages"])
    assert [m["role"] for m in out["messages"]] == [m["role"] for m in request["messages"]]
    remaining = _lines(texts_of(out["messages"]))
    for line in _lines(texts_of(request["messages"])):
        assert line in remaining
