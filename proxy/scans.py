"""Passes over a list of messages that find what changed between two lists, or which
messages have a role, in C: no Python step per message, which on a history of thousands
was a measurable share of a request (tests/benchmarks/overhead.py, --step-bytes). Pure.

Parsed messages carried from a request to the next (proxy.bodies) are the same objects,
so "unchanged" is identity (``replaced``, ``same_run``) where a pass depends on the JSON,
and value equality (``starts_with``) where it reads only values Python compares as JSON
does (a role).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.transcript import Known


def replaced(now: Iterable[Any], before: Iterable[Any]) -> Iterator[int]:
    """The indices where ``now`` holds another object than ``before`` (up to the shorter
    one's end), found in C: a Python loop over a long history was a tenth of a request's
    session work. Parsed values carried from a request to the next are compared so,
    never by value. The same list holds no other object: not walked at all."""
    if now is before:
        return iter(())
    return itertools.compress(itertools.count(), map(operator.is_not, now, before))


def same_run(now: Sequence[Any], before: Sequence[Any], start: int, stop: int) -> int:
    """How many of ``now[start:stop]`` are, one by one, the very objects of ``before``."""
    stop = min(stop, len(now), len(before))
    return next(replaced(now[start:stop], before[start:stop]), stop - start)


def same_objects(now: Sequence[Any], before: Sequence[Any]) -> bool:
    """Whether two sequences hold the very same objects, in order."""
    return now is before or (len(now) == len(before) and next(replaced(now, before), None) is None)


def starts_with(messages: list[Any], before: list[Any]) -> bool:
    """Whether ``messages`` starts with the values of ``before`` (not empty), compared in C:
    Python's == takes an object as equal to itself without looking inside, so a list of
    the very objects of ``before`` (a body's parsed messages carried to the next request)
    costs a few ns a message. Equal values that are other objects compare by value; both
    ends are checked for identity first, so a list of other objects is seldom walked
    deeply."""
    count = len(before)
    if not count or len(messages) < count:
        return False
    if messages[0] is not before[0] or messages[count - 1] is not before[count - 1]:
        return False
    return messages[:count] == before


def role(message: Any) -> Any:
    """A message's role (None for what is not an object)."""
    return message.get("role") if isinstance(message, dict) else None


def with_role(
    messages: Sequence[Any], roles: frozenset[str], known: Known | None = None, name: str = ""
) -> Sequence[int]:
    """The indices of the messages whose role is one of ``roles``: found with map and
    compress where every message is an object with a hashable role (no Python step per
    message: 1.4x faster than the loop on 3,400 messages), else one by one (what is not
    an object, or has a role that is not a string, has none of them). With ``known``
    (what the request knows of its messages), only the messages past the ones ``name``
    scanned last are looked at (Known.with_role)."""
    if known is not None and isinstance(messages, list):
        return known.with_role(name, messages, roles)
    try:
        found = map(roles.__contains__, map(dict.get, messages, itertools.repeat("role")))
        return list(itertools.compress(range(len(messages)), found))
    except TypeError:  # a message that is not an object, or an unhashable role
        return [
            index
            for index, message in enumerate(messages)
            if isinstance(its := role(message), str) and its in roles
        ]
