"""Volatile lines learned from the session itself, whatever their format.

The patterns of ``proxy.rewrite.volatile`` know some ways to write a clock; agents write
others ("It is now 08:07 on 29 November.", "Step 4 of 60", "Local time: 08:07:51"). What
changes in the system prompt between two requests of one conversation, while the rest
stays, is volatile by definition. A line's *shape* is its text with the patterns' values
masked and every number made 0: a line whose text changed while its shape did not (a new
time, a new count, a new nonce) is learned at once, and ``move_volatile`` moves it to the
tail like a pattern line from then on. A learned line that stops changing (an edit of a
number in the prompt, not a clock) is unlearned after ``UNLEARN_AFTER`` requests without
a change, so it goes back into the prefix: a prompt edited once costs one more miss, and
never a permanently moved line. Lines whose shape changed (words edited, lines added) are
never learned.

Pure functions over the session record's two fields: the previous request's line
signatures and the learned shapes with their unchanged counts.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

# Requests a learned line may go unchanged before it goes back into the system prompt.
UNLEARN_AFTER = 16
SOURCE_ROLES = frozenset({"system", "developer"})  # whose lines may be volatile
_DIGIT = re.compile(r"\d")
_NUMBER = re.compile(r"\d+")

Mask = Callable[[str], str]


def shape(text: str, mask: Mask) -> str:
    """``text`` with the patterns' values masked and every run of digits made one 0
    (9 -> 10 keeps the shape)."""
    return _NUMBER.sub("0", mask(text))


def shape_key(line: str, mask: Mask) -> bytes:
    return hashlib.blake2b(shape(line, mask).encode(), digest_size=8).digest()


def signature(line: str, mask: Mask) -> bytes:
    """16 bytes: the line's text hash, then its shape's."""
    text = hashlib.blake2b(line.encode(), digest_size=8).digest()
    return text + shape_key(line, mask)


def system_lines(messages: Any) -> list[str]:
    """Every line of the system and developer messages' text, in order."""
    lines: list[str] = []
    if not isinstance(messages, list):
        return lines
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in SOURCE_ROLES:
            continue
        content = message.get("content")
        if isinstance(content, str):
            lines += content.split("\n")
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    lines += part["text"].split("\n")
    return lines


def learn(
    previous: Sequence[bytes], current: Sequence[bytes], learned: Mapping[bytes, int]
) -> tuple[dict[bytes, int], int]:
    """(the learned shapes after this request, how many were learned by it), from the
    line signatures of the previous request and of this one."""
    updated = dict(learned)
    if list(previous) == list(current):
        changed: set[bytes] = set()
    else:
        changed = _value_changes(previous, current)
    new = 0
    for key in changed:
        if key not in updated:
            new += 1
        updated[key] = 0
    present = {sig[8:] for sig in current}
    for key in list(updated):
        if key in changed:
            continue
        if key in present:
            updated[key] += 1
            if updated[key] >= UNLEARN_AFTER:
                del updated[key]
    return updated, new


def _value_changes(previous: Sequence[bytes], current: Sequence[bytes]) -> set[bytes]:
    """Shapes of lines aligned with a line of the same shape whose text differs."""
    matcher = difflib.SequenceMatcher(
        None, [s[8:] for s in previous], [s[8:] for s in current], autojunk=False
    )
    changed: set[bytes] = set()
    for tag, i1, _i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            continue
        for offset in range(j2 - j1):
            before, after = previous[i1 + offset], current[j1 + offset]
            if before[:8] != after[:8]:
                changed.add(after[8:])
    return changed


def learned_line(learned: Iterable[bytes] | None, mask: Mask) -> Callable[[str], bool] | None:
    """A test of whether a line is one of ``learned``'s shapes (None: nothing learned)."""
    keys = frozenset(learned or ())
    if not keys:
        return None
    return lambda line: bool(_DIGIT.search(line)) and shape_key(line, mask) in keys
