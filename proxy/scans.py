"""Passes over a list of messages that find what changed between two lists, or which
messages have a role, in C: no Python step per message, which on a history of thousands
was a measurable share of a request (tests/benchmarks/overhead.py, --step-bytes). Pure.

Parsed messages carried from a request to the next (proxy.bodies) are the same objects,
so "unchanged" is identity (``replaced``, ``same_run``) where a pass depends on the JSON,
and value equality (``starts_with``) where it reads only values Python compares as JSON
does (a role).
"""

from __future__ import annotations

import ctypes
import itertools
import operator
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from proxy.known import Known

# The lists a request's passes look through for roles, by the names their scans are carried
# on under (Known.with_role): the messages as the client sent them, and as rewritten.
CLIENT_MESSAGES, REWRITTEN_MESSAGES = "client", "rewritten"


def replaced(now: Iterable[Any], before: Iterable[Any]) -> Iterator[int]:
    """The indices where ``now`` holds another object than ``before`` (up to the shorter
    one's end), found in C: a Python loop over a long history was a tenth of a request's
    session work. Parsed values carried from a request to the next are compared so,
    never by value. The same list holds no other object: not walked at all. Two long
    lists are compared a block of object addresses at a time (``_replaced_by_block``)."""
    if now is before:
        return iter(())
    if (
        _ADDRESSES_READABLE
        and type(now) is list
        and type(before) is list
        and min(len(now), len(before)) >= 2 * BLOCK
        and sum(map(operator.is_not, now[:LEAD], before[:LEAD])) < DENSE
    ):
        return _replaced_by_block(now, before)
    return itertools.compress(itertools.count(), map(operator.is_not, now, before))


# Lists whose first LEAD objects differ at DENSE places or more (a history with every
# other reply restored) are walked at once: their blocks would all differ, and reading
# the addresses first costs such a scan 5 us for nothing.
LEAD, DENSE = 32, 3


# Lists compared a block at a time: each block's addresses in one comparison of bytes.
BLOCK = 256
_WORD = ctypes.sizeof(ctypes.c_void_p)
# Where a list object holds the address of its array of item pointers (CPython's
# PyListObject: the variable-size header, ob_item, allocated).
_ITEMS_AT = list.__basicsize__ - 2 * _WORD


def _addresses(items: list[Any], count: int) -> bytes:
    """The addresses of ``items[:count]`` (CPython: what ``id`` gives), as the list holds
    them: one copy of its array of pointers, 3 us for 3,400 items where ``map(id, ...)``
    takes 160 us. Read only while the list holds them, so no address is of a freed
    object."""
    array = ctypes.c_void_p.from_address(id(items) + _ITEMS_AT).value
    return ctypes.string_at(array, count * _WORD) if count and array else b""


def _readable() -> bool:
    """Whether this interpreter lays lists out as ``_addresses`` reads them (CPython), and
    ``id`` is an address: checked once, on a list made for it, else ``replaced`` maps."""
    try:
        sample = [object() for _ in range(3)]
        return _addresses(sample, 3) == b"".join(
            id(item).to_bytes(_WORD, sys.byteorder) for item in sample
        )
    except Exception:
        return False


_ADDRESSES_READABLE = _readable()


def _replaced_by_block(now: list[Any], before: list[Any], block: int = BLOCK) -> Iterator[int]:
    """``replaced`` for two lists, by block: a block whose objects are all the same is one
    comparison of its addresses (bytes, in C), and a block that differs is walked object
    by object; from two in a row, the rest is (a history with every other message
    replaced is walked as without blocks). 3,400 messages, none or two replaced: 11-17 us,
    where the walk takes 90-140 us; every other one replaced: as the walk."""
    count = min(len(now), len(before))
    ours, theirs = _addresses(now, count), _addresses(before, count)
    size = block * _WORD

    def differs(start: int) -> bool:
        at = start * _WORD
        return ours[at : at + size] != theirs[at : at + size]

    def walk(start: int, stop: int) -> Iterator[int]:
        if start == 0 and stop == count:  # no copies of the lists
            return itertools.compress(itertools.count(), map(operator.is_not, now, before))
        found = map(operator.is_not, now[start:stop], before[start:stop])
        return itertools.compress(itertools.count(start), found)

    def walks(start: int) -> Iterator[Iterator[int]]:  # past a block that differed
        differed = True
        while start < count:
            if not differs(start):
                start, differed = start + block, False
                continue
            stop = count if differed else start + block
            yield walk(start, stop)
            start, differed = stop, True

    start = 0
    while start < count and not differs(start):
        start += block
    if start >= count:
        return iter(())
    after = start + block
    if after >= count or differs(after):
        return walk(start, count)
    return itertools.chain(walk(start, after), itertools.chain.from_iterable(walks(after)))


def same_run(now: Sequence[Any], before: Sequence[Any], start: int, stop: int) -> int:
    """How many of ``now[start:stop]`` are, one by one, the very objects of ``before``.
    From the start to the shorter one's end, the lists are compared as they are: slices
    would be copies, whose every item's count of references is raised and lowered again
    (a long history's thousands of objects, spread over the heap: 20 us at 1,900)."""
    shorter = min(len(now), len(before))
    stop = min(stop, shorter)
    if start == 0 and stop == shorter:
        return next(replaced(now, before), stop)
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
