"""A body parsed as the continuation of a kept one (proxy.bodies) is a shortcut, not another
answer: it parses to exactly what ``orjson.loads`` gives the whole body (values, types,
key order), whatever the client's JSON looks like and however its history moves, and the
spans it reports are where each message's bytes are."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import jsonio
from proxy.bodies import (
    HEAD,
    INPUT,
    MESSAGES,
    SHORT_KEPT,
    WINDOW,
    Array,
    BodyCache,
    message_spans,
)
from tests.support.conversations import conversations

# How clients write JSON: compact, Python's default spacing, indented, ASCII escapes.
STYLES = (
    {"separators": (",", ":"), "ensure_ascii": False},
    {},
    {"indent": 2},
    {"indent": "\t", "ensure_ascii": True},
    {"separators": (" , ", " : ")},
)
TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
# A system prompt longer than the bytes bodies are grouped by: smaller histories are not kept.
SYSTEM = {"role": "system", "content": "You are an agent. " * (HEAD // 16)}


def exactly(value: Any) -> bytes:
    """``value`` as bytes that tell apart key order and types (1, 1.0, true)."""
    return orjson.dumps(value)


def object_of(items: list[tuple[str, Any]], style: dict[str, Any]) -> bytes:
    """A JSON object with these items in this order (a key may repeat, as a client may
    write it), each value written in ``style``."""
    separators = style.get("separators", (",", ": "))
    parts = [json.dumps(key) + separators[1] + json.dumps(value, **style) for key, value in items]
    return ("{" + separators[0].join(parts) + "}").encode()


def body(
    messages: list[Any],
    style: dict[str, Any],
    layout: str = "first",
    step: int = 0,
    key: str = "messages",
) -> bytes:
    if layout == "first":  # openai-python: messages, then the rest
        items = [(key, messages), ("model", "m"), ("tools", TOOLS)]
    elif layout == "last":  # tools and settings before the history
        items = [("model", "m"), ("tools", TOOLS), ("temperature", 0.5), (key, messages)]
    elif layout == "moving":  # something after the history that changes every step
        items = [("model", "m"), (key, messages), ("metadata", {"step": step, "n": 1.0})]
    else:  # a key before the history written again after it, with another value
        items = [("user", "first"), (key, messages), ("stream", True), ("user", f"s{step}")]
    return object_of(items, style)


def check(parsed: Any, raw: bytes, key: str = "messages") -> None:
    assert exactly(parsed.payload) == exactly(orjson.loads(raw))
    if parsed.spans is not None:
        messages = parsed.payload[key]
        assert len(parsed.spans) == len(messages)
        for (start, end), message in zip(parsed.spans, messages, strict=True):
            assert exactly(orjson.loads(raw[start:end])) == exactly(message)


def system(clock: str, step: int) -> dict[str, Any]:
    """The system prompt as a client writes it at ``step``: with a clock at its top (fixed
    width, within the bytes bodies are grouped by) or at its end (growing), or none."""
    if clock == "top":
        return {**SYSTEM, "content": f"Now: {step * 7919:012d}. " + SYSTEM["content"]}
    if clock == "end":
        return {**SYSTEM, "content": SYSTEM["content"] + f"Step {7**step} at {step}:00."}
    return SYSTEM


@settings(max_examples=150, deadline=None)
@given(
    conversations(),
    st.sampled_from(STYLES),
    st.sampled_from(("first", "last", "moving", "repeated")),
    st.lists(st.integers(min_value=0, max_value=40), max_size=3),
    st.sampled_from(("none", "top", "end")),
    st.sampled_from((MESSAGES, INPUT)),
)
def test_a_growing_session_parses_as_orjson_parses_it(
    messages: list[dict[str, Any]],
    style: dict[str, Any],
    layout: str,
    edits: list[int],
    clock: str,
    array: Array,
) -> None:
    # The history as chat messages, or as the Responses API's input items (the cache does
    # not read the elements: any JSON values).
    cache = BodyCache(1 << 20, min_body=0, array=array)
    continued = 0
    for step in range(1, len(messages) + 1):
        history = [system(clock, step), *messages[:step]]
        for index in edits:  # a client that changes an old message now and then
            if 0 < index < len(history) and step % 3 == 0:
                history[index] = {**history[index], "content": f"edited at {step}"}
        raw = body(history, style, layout, step, array.key)
        parsed = cache.parse(raw)
        check(parsed, raw, array.key)
        continued += parsed.reused > 0
    if len(messages) > 2 and not edits:
        assert continued == len(messages) - 1  # every step after the first continued


def test_a_changed_system_prompt_is_parsed_alone() -> None:
    cache = BodyCache(1 << 20, min_body=0)
    history = [{"role": "user", "content": "x" * 5000}, {"role": "assistant", "content": "ok"}]
    first = cache.parse(body([system("end", 1), *history], {"indent": 1}))
    raw = body([system("end", 2), *history, {"role": "user", "content": "go"}], {"indent": 1})
    second = cache.parse(raw)
    check(second, raw)
    assert second.reused == 2  # the user and assistant messages: the same objects
    assert second.payload["messages"][1] is first.payload["messages"][1]
    assert second.reused_bytes > 5000


def test_two_changed_messages_or_one_grown_past_the_window_are_parsed_whole() -> None:
    history = [SYSTEM, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    longer = [*history, {"role": "user", "content": "c"}]
    cases = (
        [system("end", 2), {"role": "user", "content": "A"}, *longer[2:]],
        [{**SYSTEM, "content": SYSTEM["content"] + "y" * (WINDOW + 10)}, *longer[1:]],
    )
    for changed in cases:
        cache = BodyCache(1 << 20, min_body=0)
        cache.parse(body(history, {}))
        raw = body(changed, {})
        parsed = cache.parse(raw)
        check(parsed, raw)
        assert parsed.reused == 0


def test_the_continued_messages_are_the_earlier_parse_s_objects() -> None:
    cache = BodyCache(1 << 20, min_body=0)
    history = [SYSTEM, {"role": "user", "content": "hi"}]
    first = cache.parse(body(history, {}))
    second = cache.parse(body([*history, {"role": "assistant", "content": "hello"}], {}))
    assert second.reused == 2 and second.reused_bytes > HEAD
    kept = zip(first.payload["messages"], second.payload["messages"], strict=False)
    assert all(a is b for a, b in kept)


def test_what_follows_the_history_is_the_earlier_parse_s_objects_too() -> None:
    """openai-python's layout (the tools after the history): once a step has parsed them
    after its messages, the next ones take its objects instead of parsing them again."""
    cache = BodyCache(1 << 20, min_body=0)
    history = [SYSTEM, {"role": "user", "content": "hi"}]
    steps = []
    for step in range(4):
        history = [*history, {"role": "assistant", "content": f"step {step}"}]
        raw = body(history, {})
        parsed = cache.parse(raw)
        check(parsed, raw)
        steps.append(parsed)
    tail = raw[parsed.spans[-1][1] :]
    assert parsed.reused_bytes == parsed.spans[-2][1] + len(tail)
    assert steps[2].payload["tools"] is steps[1].payload["tools"]
    assert steps[3].payload["tools"] is steps[1].payload["tools"]


@pytest.mark.parametrize(
    "between",
    [
        b'], "metadata": [1',  # closes the array, a key of its own, an array the tail closes
        b', {"role": "user", "content": "x"}], "stream": true, "extra": [2',
    ],
)
def test_new_bytes_that_close_the_history_before_the_kept_tail_parse_whole(between: bytes) -> None:
    """A body that ends with the kept body's tail, but whose new bytes close the history and
    open keys of their own, is not the kept tail after new messages: it parses as orjson
    parses it."""
    cache = BodyCache(1 << 20, min_body=0)
    history = [SYSTEM, {"role": "user", "content": "hi"}]
    for step in range(2):  # the second step keeps the tail parsed apart
        history = [*history, {"role": "assistant", "content": f"step {step}"}]
        cache.parse(body(history, {}))
    kept = body(history, {})
    end = kept.rindex(b"]", 0, kept.index(b'"model"'))
    raw = kept[:end] + between + kept[end:]
    parsed = cache.parse(raw)
    check(parsed, raw)
    assert "metadata" in parsed.payload or "extra" in parsed.payload


def test_another_conversation_sharing_what_follows_leaves_the_kept_body() -> None:
    # Two tasks on one system prompt whose next messages are the same bytes (a templated
    # agent's first tool calls): the second is parsed as the first with its user message
    # changed, and the first conversation's next step still continues its own body.
    cache = BodyCache(1 << 20, min_body=0)
    follows = [{"role": "assistant", "content": "looking"}, {"role": "tool", "content": "x" * 3000}]
    first = [SYSTEM, {"role": "user", "content": "task a"}, *follows]
    second = [SYSTEM, {"role": "user", "content": "task b"}, *follows]
    cache.parse(body(first, {}))
    assert cache.parse(body(second, {})).reused == 3
    raw = body([*first, {"role": "assistant", "content": "done"}], {})
    parsed = cache.parse(raw)
    check(parsed, raw)
    assert parsed.reused == len(first)


def keeping_one_body() -> tuple[BodyCache, bytes]:
    """A cache that kept one body (a system prompt and a user message), and that body."""
    cache = BodyCache(1 << 20, min_body=0)
    kept = body([SYSTEM, {"role": "user", "content": "hi"}], {})
    cache.parse(kept)
    return cache, kept


def test_a_new_part_that_is_not_json_is_the_whole_body_s_error() -> None:
    cache, good = keeping_one_body()
    broken = good[:-1] + b', "model": }'
    with pytest.raises(jsonio.InvalidJSON) as caught:
        cache.parse(broken)
    with pytest.raises(jsonio.InvalidJSON) as whole:
        jsonio.loads(broken)
    assert str(caught.value) == str(whole.value)


def test_a_later_messages_key_wins_as_in_a_whole_parse() -> None:
    cache, first = keeping_one_body()
    twice = first[:-1] + b', "messages": [{"role": "user", "content": "other"}]}'
    parsed = cache.parse(twice)
    assert parsed.reused == 0
    check(parsed, twice)


def test_a_nested_messages_key_leaves_the_body_unkept() -> None:
    raw = object_of([("metadata", {"messages": [1]}), ("messages", [{"role": "user"}])], {})
    assert message_spans(raw) is None
    cache = BodyCache(1 << 20, min_body=0)
    parsed = cache.parse(raw)
    check(parsed, raw)
    assert parsed.spans is None and cache.held == 0


def test_bodies_are_continued_only_under_the_same_credential() -> None:
    cache = BodyCache(1 << 20, min_body=0)
    history = [SYSTEM, {"role": "user", "content": "hi"}]
    cache.parse(body(history, {}), b"Bearer a")
    longer = body([*history, {"role": "assistant", "content": "yes"}], {})
    assert cache.parse(longer, b"Bearer b").reused == 0
    assert cache.parse(longer + b" ", b"Bearer b").reused == 3


def test_small_bodies_are_parsed_whole_and_not_kept() -> None:
    cache = BodyCache(1 << 20, min_body=1 << 10)
    raw = body([{"role": "user", "content": "hi"}], {})
    parsed = cache.parse(raw)
    assert parsed.spans is None and cache.held == 0
    tiny = BodyCache(1 << 20, min_body=0)  # messages within the group's bytes: not kept
    assert tiny.parse(raw).spans is not None and tiny.held == 0
    assert BodyCache(0, min_body=0).parse(raw).spans is None  # 0: nothing kept


def test_what_is_kept_stays_within_its_bytes() -> None:
    cache = BodyCache(8 << 10, min_body=0)
    sessions = [[{"role": "user", "content": f"task {n} " + "x" * 2000}] for n in range(12)]
    for history in sessions:
        cache.parse(body(history, {}))
        assert 0 < cache.held <= 8 << 10
    # The newest sessions are still continued, the oldest were dropped.
    newest = sessions[-1]
    assert cache.parse(body([*newest, {"role": "assistant", "content": "ok"}], {})).reused == 1
    oldest = sessions[0]
    assert cache.parse(body([*oldest, {"role": "assistant", "content": "ok"}], {})).reused == 0


def test_any_number_of_conversations_on_one_prompt_are_continued() -> None:
    # An agent serving many users: every conversation shares the system prompt and tools
    # (one group), and each one's next step still continues its own body.
    cache = BodyCache(1 << 30, min_body=0)
    sessions = [
        [
            SYSTEM,
            {"role": "user", "content": f"task {n} " + "x" * 300},
            {"role": "assistant", "content": f"{n}"},
        ]
        for n in range(500)
    ]
    for history in sessions:
        cache.parse(body(history, {}))
    step = {"role": "user", "content": "more"}
    assert all(cache.parse(body([*history, step], {})).reused == 3 for history in sessions)


def test_a_group_keeps_its_most_recent_short_first_requests() -> None:
    # First requests whose user message ends before a whole probe are tried one by one:
    # a group keeps the most recent of them.
    cache = BodyCache(1 << 30, min_body=0)
    # Each differs from the others in two messages: none continues another's body.
    sessions = [
        [SYSTEM, {"role": "user", "content": f"task {n}"}, {"role": "assistant", "content": f"{n}"}]
        for n in range(SHORT_KEPT + 8)
    ]
    for history in sessions:
        cache.parse(body(history, {}))
    step = {"role": "user", "content": "more"}
    assert cache.parse(body([*sessions[-1], step], {})).reused == 3
    assert cache.parse(body([*sessions[0], step], {})).reused == 0


def test_a_continued_body_says_how_many_leading_messages_are_the_kept_objects() -> None:
    """Known.lead, which a chain over the messages trusts instead of checking each one
    (proxy.transcript.Memo): all the kept messages where the body appends to them, those
    before the changed one where one changed."""
    cache = BodyCache(1 << 20, min_body=0)
    history = [SYSTEM, {"role": "user", "content": "hi"}, {"role": "tool", "content": "x" * 3000}]
    first = cache.parse(body(history, {}))
    longer = [*history, {"role": "assistant", "content": "ok"}]
    appended = cache.parse(body(longer, {}))
    edited = [longer[0], {"role": "user", "content": "HI"}, *longer[2:], {"role": "user"}]
    changed = cache.parse(body(edited, {}))
    assert changed.reused == len(longer) - 1  # parsed as the kept body with one changed
    for parsed, before, lead in ((appended, first, 3), (changed, appended, 1)):
        assert parsed.known is not None and parsed.known.lead is not None
        now, kept, count = parsed.known.lead
        assert now is parsed.payload["messages"] and kept is before.payload["messages"]
        assert count == lead
        assert all(a is b for a, b in zip(now[:count], kept, strict=False))
        assert count == len(kept) or now[count] is not kept[count]
