"""Which keys find a session's recorded history: the first exchange that tells one
conversation from another with the same head, and the history's keys across a change of
the system prompt. Pure functions over messages and the session record; no I/O."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from proxy.rewrite.learned import SOURCE_ROLES
from proxy.sessions import Session
from proxy.transcript import Memo, chain_keys, next_key

Mask = Callable[[str], str]


def head_key(messages: Iterable[Any], mask: Mask) -> bytes | None:
    """The chain key of the first two messages after the system prompt (the first
    exchange), None if there are fewer. Read up to those two, not through the history
    (a new session's first request may bring thousands)."""
    body = (m for m in messages if not isinstance(m, dict) or m.get("role") not in SOURCE_ROLES)
    first = list(itertools.islice(body, 2))
    return chain_keys(first, mask)[-1] if len(first) == 2 else None


def leading_system(messages: Sequence[Any]) -> int:
    """How many messages the system prompt takes at the start."""
    count = 0
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in SOURCE_ROLES:
            break
        count += 1
    return count


def history_keys(
    session: Session,
    messages: Sequence[Any],
    keys: list[bytes],
    mask: Mask,
    memo: Memo | None = None,
) -> list[bytes]:
    """The keys to look the session's recorded history up by: ``keys``, or, where the
    system prompt changed since the session's previous request (an edit, a line learned
    by this request), the history's keys continued from the previous system prompt's, if
    the history was recorded by those. The session is this conversation's already; what
    follows its system prompt is the same history."""
    lead = leading_system(messages)
    if not lead or not session.system_key or keys[lead - 1] == session.system_key:
        return keys
    continued = keys[:lead]
    previous = session.system_key
    for message in messages[lead:]:
        previous = next_key(previous, message, mask, memo)
        continued.append(previous)
    return continued if _recorded(session, continued) > _recorded(session, keys) else keys


def _recorded(session: Session, keys: Sequence[bytes]) -> int:
    """How many of ``keys`` the session has history recorded by."""
    return sum(1 for key in keys if key in session.substitutions)
