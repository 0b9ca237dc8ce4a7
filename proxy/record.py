"""What a request records for its history (proxy.prefix.recorded_at: each message the
rewrites replaced, as sent) and what restoration then gives the next request for it
(proxy.rewrite.restore.Carried), worked out while the engine reads the request.

A client that sends every reply back in another form (the OpenAI SDK re-dumps each tool
call) has half its history restored and recorded again on every step: 1,150 messages of
a 1 MB step, some 500 us a step (in process) when each was looked at. The previous
request's result, carried with its body (Known.restore_next), already says where it
recorded: a message that is still the very object restoration gave it then is recorded
again now, and one it gave back as the client's is not. So with the carried result only
the messages new since, or changed (one scan in C, by identity), are looked at. Pure.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

from proxy import prefix
from proxy.known import Known
from proxy.rewrite.restore import Carried, continues
from proxy.scans import replaced

# Beyond this many changed messages the carried result is not worth patching: the
# request is worked out as if it had none.
MAX_CHANGED = 32


@dataclasses.dataclass(frozen=True)
class Record:
    """Where a request records a message (in order), what it records there, and where the
    rewrites replaced a message it does not record (a system prompt, an equal copy) among
    those looked at."""

    at: list[int]
    substituted: list[tuple[bytes, Any]]
    unrecorded: list[int]


def recorded(
    client: Sequence[Any],
    rewritten: Sequence[Any],
    keys: Sequence[bytes],
    replaced_in: Callable[[], Sequence[int]],
    known: Known | None = None,
) -> Record:
    """The record of a request whose client messages are ``client`` (keyed ``keys``) and
    whose rewritten ones are ``rewritten``, replaced where ``replaced_in()`` says (in
    order: asked only without a carried result, which needs just the new messages'); from
    the previous request's result where ``known`` carries one that holds."""
    if len(rewritten) != len(client):
        return Record([], [], [])
    at: list[int] = []
    substituted: list[tuple[bytes, Any]] = []
    checked: Sequence[int] | None = None
    carry = _carry(known, client, keys)
    if carry is not None:
        changed = list(itertools.islice(replaced(rewritten, carry.messages), MAX_CHANGED + 1))
        if len(changed) <= MAX_CHANGED:
            at, substituted = list(carry.recorded), list(carry.substituted)
            for index in changed:  # looked at again below
                _remove(at, substituted, index)
            length = carry.length
            new = replaced(rewritten[length:], client[length:])
            checked = [*changed, *(length + index for index in new)]
    if checked is None:
        checked = replaced_in()
    found = prefix.recorded_at(client, rewritten, checked)
    for index in found:
        _insert(at, substituted, index, (keys[index], rewritten[index]))
    return Record(at, substituted, sorted(set(checked).difference(found)))


def _carry(known: Known | None, client: Sequence[Any], keys: Sequence[bytes]) -> Carried | None:
    """The previous request's restoration result, if this request continues its history
    (whether or not the record it was worked out for is still the stored one: where
    messages are recorded depends on the two requests' messages alone)."""
    carry = known.restore_next if known is not None else None
    return carry if carry is not None and continues(carry, known, client, keys) else None


def _remove(at: list[int], substituted: list[tuple[bytes, Any]], index: int) -> None:
    place = bisect.bisect_left(at, index)
    if place < len(at) and at[place] == index:
        del at[place], substituted[place]


def _insert(
    at: list[int], substituted: list[tuple[bytes, Any]], index: int, pair: tuple[bytes, Any]
) -> None:
    """``index`` into ``at`` in order: at its end, but for a changed message of the history."""
    place = len(at) if not at or at[-1] < index else bisect.bisect_left(at, index)
    at.insert(place, index)
    substituted.insert(place, pair)
