"""OpenAI chat conversations for tests: a validity check and hypothesis strategies.

``is_valid_conversation`` is DESIGN.md's invariant 2 (legal roles, every assistant tool
call answered, no orphan tool messages; tool-call ids may repeat across turns).
``conversations()`` draws valid ones; ``any_conversations()`` adds the malformed shapes
real clients send (out of order, orphan tool messages, unknown roles, odd content).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hypothesis import strategies as st

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})

# Text that the volatile detector must find, and text that looks close but must stay.
VOLATILE_SAMPLES = (
    "Current date and time: Sunday, 2026-11-29 10:15:42 UTC",
    "Today is November 29, 2026.",
    "request id: 7f3a9c2b",
    "Trace 123e4567-e89b-12d3-a456-426614174000",
    "now=1764411342",
    "It is 10:15 AM.",
)
STABLE_SAMPLES = ("You are a helpful agent.", "Use tools when needed.", "Version 1.2.3", "")


def is_valid_conversation(messages: Any) -> bool:
    if not isinstance(messages, list):
        return False
    pending: set[str] = set()  # ids of the last assistant turn's calls not yet answered
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            return False
        role = message["role"]
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in pending:
                return False
            pending.discard(call_id)
            continue
        if pending:  # a call left unanswered
            return False
        if not _valid_content(message.get("content"), nullable=role == "assistant"):
            return False
        if role == "assistant":
            calls = message.get("tool_calls")
            if calls is not None:
                ids = list(_call_ids(calls))
                if None in ids or len(set(ids)) != len(ids):
                    return False
                pending = set(ids)  # type: ignore[arg-type]
    return not pending


def _call_ids(calls: Any) -> Iterator[str | None]:
    if not isinstance(calls, list):
        yield None
        return
    for call in calls:
        call_id = call.get("id") if isinstance(call, dict) else None
        yield call_id if isinstance(call_id, str) else None


def _valid_content(content: Any, *, nullable: bool) -> bool:
    if content is None:
        return nullable
    if isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        for part in content
    )


def texts_of(messages: Any) -> list[str]:
    """Every string of message content (string content and text parts), in order."""
    found: list[str] = []
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            found.append(content)
        elif isinstance(content, list):
            found += [
                p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            ]
    return found


# --- strategies ---------------------------------------------------------------------------

_line = st.one_of(
    st.sampled_from(VOLATILE_SAMPLES + STABLE_SAMPLES),
    st.text(st.characters(codec="utf-8"), max_size=20),
)
text = st.lists(_line, max_size=4).map("\n".join)
_content = st.one_of(
    text, st.lists(st.builds(lambda t: {"type": "text", "text": t}, text), min_size=1, max_size=3)
)


@st.composite
def _turn(draw: st.DrawFn) -> list[dict[str, Any]]:
    turn: list[dict[str, Any]] = [{"role": "user", "content": draw(_content)}]
    for _ in range(draw(st.integers(0, 2))):
        # Ids repeat across turns on purpose: real models re-use them.
        ids = [f"call_{k}" for k in range(draw(st.integers(1, 2)))]
        calls = [
            {"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids
        ]
        turn.append({"role": "assistant", "content": None, "tool_calls": calls})
        turn += [{"role": "tool", "tool_call_id": i, "content": draw(_content)} for i in ids]
    if draw(st.booleans()):
        turn.append({"role": "assistant", "content": draw(text)})
    return turn


@st.composite
def conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Valid conversations: system/developer messages (often with volatile lines), then
    user turns with tool loops."""
    head = draw(
        st.lists(
            st.builds(
                lambda role, content: {"role": role, "content": content},
                st.sampled_from(["system", "developer"]),
                _content,
            ),
            max_size=2,
        )
    )
    turns = [draw(_turn()) for _ in range(draw(st.integers(0, 3)))]
    return head + [message for turn in turns for message in turn]


_junk = st.one_of(
    st.none(),
    st.integers(),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
_odd_message = st.one_of(
    _junk,
    st.fixed_dictionaries({"role": st.sampled_from(["wizard", "", "function"]), "content": text}),
    st.fixed_dictionaries({"role": st.sampled_from(sorted(ROLES)), "content": _junk}),
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["system", "user", "tool"]),
            "content": st.lists(_junk, max_size=3),
        }
    ),
    st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": st.text(max_size=4)}),
)


@st.composite
def any_conversations(draw: st.DrawFn) -> Any:
    """Valid conversations, and the same broken in the ways real clients break them."""
    messages: list[Any] = draw(conversations())
    for _ in range(draw(st.integers(0, 3))):
        action = draw(st.sampled_from(["insert", "shuffle", "drop", "none"]))
        if action == "insert":
            messages.insert(draw(st.integers(0, len(messages))), draw(_odd_message))
        elif action == "shuffle":
            messages = draw(st.permutations(messages))
        elif action == "drop" and messages:
            del messages[draw(st.integers(0, len(messages) - 1))]
    return draw(st.one_of(st.just(messages), st.just(messages), _junk))


def requests(messages: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(lambda m: {"model": "m", "messages": m}, messages)
