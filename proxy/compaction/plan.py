"""Where to cut a conversation, and what goes in place of the part cut. Pure functions.

A compacted conversation is::

    pinned head  |  one stand-in message  |  everything from the cut on, verbatim
    (system prompts, first user message)     (summary or marker)

The head stays because it states who the agent is, what tools it has and what it was asked
to do; the stand-in replaces the turns between; the rest goes as it is. A cut never falls
between an assistant message that calls tools and the results of those calls: a tool
result without its call is an invalid request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.scans import role as _role

HEAD_ROLES = frozenset({"system", "developer"})


def head_length(messages: Sequence[Any]) -> int:
    """Messages pinned at the start: the leading system/developer messages and the first
    user message after them (the task, usually)."""
    index = 0
    while index < len(messages) and _role(messages[index]) in HEAD_ROLES:
        index += 1
    if index < len(messages) and _role(messages[index]) == "user":
        index += 1
    return index


def safe_cut(messages: Sequence[Any], index: int, floor: int = 0) -> int:
    """The nearest cut at or before ``index`` (not below ``floor``) that does not separate
    tool results from the assistant message that asked for them."""
    index = min(index, len(messages))
    while index > floor and index < len(messages) and _role(messages[index]) == "tool":
        index -= 1
    return index


def newest_turn(messages: Sequence[Any], floor: int) -> int:
    """Where the newest turn starts: the last message and, when it is a tool result, the
    assistant call it answers with all that call's results."""
    return safe_cut(messages, max(len(messages) - 1, floor), floor)


def window_start(sizes: Sequence[int], messages: Sequence[Any], floor: int, tokens: int) -> int:
    """The earliest safe cut (not below ``floor``) whose tail fits in ``tokens``; the
    newest turn is always kept, whatever its size."""
    keep = newest_turn(messages, floor)
    total = sum(sizes[keep:])
    start = keep
    while start > floor:
        candidate = safe_cut(messages, start - 1, floor)
        if candidate == start:  # only tool results above: nothing safe before them
            break
        extra = sum(sizes[candidate:start])
        if total + extra > tokens:
            break
        total += extra
        start = candidate
    return start


def cut_to_fit(
    sizes: Sequence[int], messages: Sequence[Any], floor: int, fixed: int, target: int
) -> int:
    """The earliest safe cut after ``floor`` such that ``fixed`` tokens (head, stand-in,
    tools) plus the tail from the cut fit in ``target``; the newest turn when none does."""
    return window_start(sizes, messages, floor, max(target - fixed, 0))


def compacted(
    messages: Sequence[Any], head: int, stand_in: dict[str, Any] | None, cut: int
) -> list[Any]:
    """head + stand-in + messages[cut:]."""
    middle = [stand_in] if stand_in is not None else []
    return [*messages[:head], *middle, *messages[cut:]]


def tool_name(messages: Sequence[Any], index: int) -> str:
    """The function a tool result at ``index`` answers (looked up by its call id in the
    nearest assistant message before it)."""
    message = messages[index]
    call_id = message.get("tool_call_id") if isinstance(message, dict) else None
    for earlier in reversed(messages[:index]):
        if not isinstance(earlier, dict) or _role(earlier) != "assistant":
            continue
        for call in earlier.get("tool_calls") or ():
            if isinstance(call, dict) and call.get("id") == call_id:
                function = call.get("function")
                if isinstance(function, dict) and isinstance(function.get("name"), str):
                    return function["name"]
        break
    name = message.get("name") if isinstance(message, dict) else None
    return name if isinstance(name, str) else "a tool"


def elision_candidates(
    messages: Sequence[Any],
    sizes: Sequence[int],
    start: int,
    stop: int,
    *,
    min_tokens: int,
    after_steps: int,
) -> list[int]:
    """Tool results in messages[start:stop] of at least ``min_tokens`` tokens, followed by
    at least ``after_steps`` assistant messages (model calls) after them."""
    if min_tokens <= 0:
        return []
    later_steps = 0
    found: list[int] = []
    for index in range(len(messages) - 1, start - 1, -1):
        role = _role(messages[index])
        if role == "assistant":
            later_steps += 1
        elif (
            role == "tool"
            and index < stop
            and later_steps >= after_steps
            and sizes[index] >= min_tokens
        ):
            found.append(index)
    return sorted(found)


def elided(message: dict[str, Any], name: str, tokens: int, preview_chars: int = 160) -> dict:
    """A short stand-in for a large tool result: what it was and how to get it again."""
    text = _text(message.get("content"))
    preview = " ".join(text[:preview_chars].split())
    more = "..." if len(text) > preview_chars else ""
    content = (
        f"[Result of {name} elided by the proxy to save context: about {tokens} tokens. "
        f"It began: {preview}{more} Call the tool again if its full result is needed.]"
    )
    return {**message, "content": content}


def marker(dropped: int | None = None) -> dict[str, Any]:
    """Stand-in for turns dropped without a summary (the fallback); without a count, the
    shortest stand-in there is."""
    what = f"{dropped} earlier messages" if dropped else "Earlier messages"
    return {
        "role": "user",
        "content": f"[{what} of this conversation were removed to fit the context window.]",
    }


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part.get("text", "") for part in content if isinstance(part, dict) and "text" in part
        )
    return ""
