"""Volatile values (clocks, dates, UUIDs, request ids) moved out of the system prompt.

A system prompt that carries the current time changes on every request, and vLLM reuses
KV blocks only for an exact token prefix: the whole conversation is prefilled again at
every step. The lines that carry such values are moved, verbatim and in order, into a
fixed-format note at the end of the newest user or tool message::

    <that message's text>

    [Context moved from the system prompt: it changes on every request]
    <moved line 1>
    <moved line 2>

String content gets the note appended (``content + note_for(lines)``); list content gets
it as one more part (``{"type": "text", "text": note_for(lines)}``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from proxy.identity import ByIdentity
from proxy.known import Known
from proxy.rewrite.detector import DEFAULT_DETECTOR, VolatileDetector
from proxy.rewrite.learned import SOURCE_ROLES, learned_line
from proxy.rewrite.pipeline import Request, RewriteContext, transform
from proxy.scans import CLIENT_MESSAGES, REWRITTEN_MESSAGES, with_role

NOTE_HEADER = "[Context moved from the system prompt: it changes on every request]"
TARGET_ROLES = frozenset({"user", "tool"})


def detector_of(context: RewriteContext) -> VolatileDetector:
    """The settings' detector the context carries, else the built-in one."""
    volatile = context.volatile
    return volatile if isinstance(volatile, VolatileDetector) else DEFAULT_DETECTOR


def note_for(lines: Sequence[str]) -> str:
    """The note that carries ``lines`` to the tail; its start never changes."""
    return "\n\n" + "\n".join([NOTE_HEADER, *lines])


@transform("move_volatile")
def move_volatile(request: Request, context: RewriteContext) -> Request | None:
    """Volatile lines of system and developer messages moved to a note at the end of the
    newest user or tool message. None when there is nothing to move, no such message to
    carry the note, or the messages are not the shape this can handle."""
    messages = request.get("messages")
    if not isinstance(messages, list):
        return None
    detector = detector_of(context)
    target = note_target(messages)
    if target is None:
        return None
    also = learned_of(context.session, detector)
    rewritten = list(messages)
    moved: list[str] = []
    for index in with_role(messages, SOURCE_ROLES, context.known, REWRITTEN_MESSAGES):
        message = messages[index]
        content, lines = _split_content(message.get("content"), detector, also)
        if lines:
            rewritten[index] = _without_lines(message, content)
            moved += lines
    if not moved:
        return None
    said = said_before(context.session, context.message_keys, target)
    new = [line for line in moved if line not in said]
    if not new:
        # Unchanged since the notes the session's history still carries (each restored
        # with the message it was added to): no need to say it again.
        return {**request, "messages": rewritten}
    carrier = rewritten[target]
    rewritten[target] = {**carrier, "content": _append(carrier["content"], note_for(new))}
    return {**request, "messages": rewritten}


# What move_volatile made of a source message, by the source's identity: (its content
# without the moved lines, the message with that content).
_MADE: ByIdentity[tuple[Any, dict[str, Any]]] = ByIdentity(128)


def _without_lines(message: dict[str, Any], content: Any) -> dict[str, Any]:
    """``message`` with ``content``: the very object made the last time, where that was
    made of this same message with the same content (a split is cached: the same text and
    learned lines give the same string). A session's steps then forward one system prompt
    object, whose digests, scans and encoding are found by identity, not worked out again
    (tests/benchmarks/README.md: 64 KB steps, about 5% of the proxy's CPU)."""
    made = _MADE.get(message)
    if made is not None and made[0] is content:
        return made[1]
    return _MADE.put(message, (content, {**message, "content": content}))[1]


MAX_NOTE_CARRIERS = 64  # notes one after another before a note says every line again


def said_before(session: Any, keys: Sequence[bytes], target: int) -> frozenset[str]:
    """The moved lines this request's history already carries in notes: the session's
    lines, if every message that carried one of its notes is still in the history before
    ``target`` (a client that trimmed its history, a retried request whose newest message
    carried the last note, a compacted session: none). A note says only what is new: a
    block that grows by a line a step adds that line, not the whole block again."""
    carriers = getattr(session, "note_carriers", ())
    if not carriers or len(carriers) >= MAX_NOTE_CARRIERS:
        return frozenset()
    compaction = getattr(session, "compaction", None)
    if compaction is not None and compaction.cut_key is not None:
        return frozenset()  # folded turns may have taken notes with them
    if not _all_in(carriers, keys, target):
        return frozenset()
    return frozenset(session.last_note_lines)


def _all_in(carriers: Sequence[bytes], keys: Sequence[bytes], stop: int) -> bool:
    """Whether every carrier is one of ``keys[:stop]``. Each is looked for first where it
    was found before (``_FOUND_AT``), then one after another in C (the carriers come in
    the order of their messages): one pass, without hashing the history into a set,
    which is built only where they are not found so."""
    start, stop = 0, min(stop, len(keys))
    try:
        for carrier in carriers:
            at = _FOUND_AT.get(carrier, -1)
            if not (start <= at < stop and keys[at] == carrier):
                at = keys.index(carrier, start, stop)
                _found_at(carrier, at)
            start = at + 1
        return True
    except ValueError:
        history = set(keys[:stop])
        return all(carrier in history for carrier in carriers)


# Where each note carrier was last found, in this process. A key names its message and
# every one before it (proxy.transcript.chain_keys), so it is only ever at one index: a
# history of 3,000 messages whose note went out with its first request is not searched
# from its start on every step (80 us a search). Checked before it is believed.
_FOUND_AT: dict[bytes, int] = {}
MAX_FOUND_AT = 1 << 16


def _found_at(carrier: bytes, at: int) -> None:
    if len(_FOUND_AT) >= MAX_FOUND_AT:
        _FOUND_AT.clear()
    _FOUND_AT[carrier] = at


def volatile_lines(
    messages: Any, detector: VolatileDetector, session: Any = None, known: Known | None = None
) -> tuple[str, ...]:
    """The lines ``move_volatile`` moves out of these messages (the client's, for
    ``session``), in order."""
    if not isinstance(messages, list):
        return ()
    also = learned_of(session, detector)
    moved: list[str] = []
    for index in with_role(messages, SOURCE_ROLES, known, CLIENT_MESSAGES):
        moved += _split_content(messages[index].get("content"), detector, also)[1]
    return tuple(moved)


def notes_after(
    messages: list[Any],
    detector: VolatileDetector,
    record: Any,
    lookup_keys: Sequence[bytes],
    keys: Sequence[bytes],
    known: Known | None = None,
) -> tuple[tuple[bytes, ...], tuple[str, ...]] | tuple[()]:
    """(the record's note carriers, its note lines) after a request whose ``messages`` were
    rewritten with ``record``; () if it has nothing to say. ``lookup_keys``: the keys its
    history was found by; ``keys``: the keys it is recorded by."""
    lines = volatile_lines(messages, detector, record, known)
    target = note_target(messages)
    if target is None or not lines:
        return ()
    said = said_before(record, lookup_keys, target)
    carriers = record.note_carriers
    if lookup_keys is not keys:  # found by the keys of the prompt before
        renamed = dict(zip(lookup_keys, keys, strict=False))
        carriers = tuple(renamed.get(key, key) for key in carriers)
    if all(line in said for line in lines):
        return carriers, record.last_note_lines  # no note: the notes say it all
    # A note of the new lines joins the notes before it; a full note starts again. All the
    # lines are in the history's notes from now on.
    _found_at(keys[target], target)
    return ((*carriers, keys[target]) if said else (keys[target],)), lines


def learned_of(session: Any, detector: VolatileDetector) -> Callable[[str], bool] | None:
    """The session's learned volatile lines as a test (proxy.rewrite.learned)."""
    return learned_line(getattr(session, "learned", None), detector.mask)


def note_target(messages: list[Any]) -> int | None:
    """The newest user or tool message whose content can take a note."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, dict) and message.get("role") in TARGET_ROLES:
            return index if isinstance(message.get("content"), str | list) else None
    return None


def _split_content(
    content: Any, detector: VolatileDetector, also: Callable[[str], bool] | None = None
) -> tuple[Any, Sequence[str]]:
    if isinstance(content, str):
        return detector.split(content, also)
    if not isinstance(content, list):
        return content, ()
    parts: list[Any] = []
    moved: list[str] = []
    for part in content:
        if _is_text_part(part):
            text, lines = detector.split(part["text"], also)
            moved += lines
            if lines and not text:
                continue  # the part held only volatile lines (a prepended clock part)
            part = {**part, "text": text} if lines else part
        parts.append(part)
    if moved and not parts:  # keep one part: an empty list is not valid content
        parts = [{"type": "text", "text": ""}]
    return parts, moved


def _is_text_part(part: Any) -> bool:
    return (
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
    )


def _append(content: str | list[Any], note: str) -> str | list[Any]:
    if isinstance(content, str):
        return content + note
    return [*content, {"type": "text", "text": note}]
