"""History restoration: messages the client sends back changed only in form are replaced by
what the proxy forwarded (or the engine emitted) for them before, byte for byte."""

from __future__ import annotations

import bisect
import dataclasses
import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from proxy.known import Known
from proxy.rewrite.pipeline import Request, RewriteContext, transform
from proxy.sessions import Session
from proxy.transcript import chain_keys

if TYPE_CHECKING:
    from proxy.record import Record


@dataclasses.dataclass(frozen=True)
class Carried:
    """What restoration gives a session's next request for the history this one had, worked
    out from this request's record (``carried``) while the engine reads it: the next one
    looks up only its new messages. Valid once this request's record is saved (``saved``:
    the record's version, and its last chain link), if the next request finds that very
    record and continues this request's messages."""

    client: list[Any]  # this request's client messages
    length: int  # its history: all but the newest message
    last_key: bytes  # the lookup key of the history's last message
    messages: list[Any]  # restoration's result for the history
    # where this request recorded a message of the history, and what (proxy.record)
    recorded: list[int]
    substituted: list[tuple[bytes, Any]]
    saved: tuple[int, bytes] | None = None

    @property
    def restores(self) -> bool:
        """Whether restoration replaces anything in the history."""
        return bool(self.recorded)

    def once_saved(self, saved: tuple[int, bytes]) -> Carried:
        """This, valid from the record ``saved`` on. Field by field, as Session.copy:
        dataclasses.replace runs a frozen class's __init__, 4 us of each step."""
        copied = object.__new__(Carried)
        copied.__dict__.update(self.__dict__, saved=saved)
        return copied


@transform("restore_history")
def restore_history(request: Request, context: RewriteContext) -> Request | None:
    """Frameworks re-serialize tool-call arguments, turn ``null`` content into ``""``, trim
    whitespace, drop reasoning: each such change breaks the engine's prefix cache from that
    message on. A message whose key (its meaning, up to those changes, and everything
    before it) matches a substitution the session recorded is sent as recorded. A change
    in meaning changes the key: the client's version goes as it is."""
    session = context.session
    messages = request.get("messages")
    if session is None or not session.substitutions or not isinstance(messages, list):
        return None
    keys = context.message_keys or chain_keys(messages, context.mask)
    substitutions = session.substitutions
    # The newest message is this request's input: the pipeline makes its forwarded form
    # afresh (a retry gets the same bytes again from the same transforms).
    history = keys[: len(messages) - 1]
    carried = _carried(context.known, session, messages, keys)
    start = 0 if carried is None else carried.length
    restored = None
    if carried is not None and carried.restores:
        restored = carried.messages + messages[start:]
    # The messages with a substitution are found at C speed (a long history has thousands
    # without); with the previous request's result carried, only among the new ones.
    new = history[start:] if start else history
    found = map(substitutions.__contains__, new)
    for index in itertools.compress(range(start, len(history)), found):
        replacement = substitutions[history[index]]
        if replacement != messages[index]:
            restored = restored if restored is not None else list(messages)
            restored[index] = replacement
    return None if restored is None else {**request, "messages": restored}


def carried(
    client: list[Any],
    rewritten: Sequence[Any],
    keys: Sequence[bytes],
    lookup_keys: Sequence[bytes],
    record: Record,
) -> Carried | None:
    """What restoration will give the next request for this one's history, once this
    request's ``record`` (proxy.record) is saved as its only change: each message it
    records as the pipeline sent it, every other one as the client did: a message
    restored this time is recorded again, one whose record equals the client's is not
    replaced, and one replaced but not recorded (a system prompt, an equal copy) has
    nothing to be restored from. None where the history was looked up by other keys than
    it is recorded by (a changed system prompt)."""
    length = len(client) - 1
    if length <= 0 or len(rewritten) != len(client) or len(keys) != len(client):
        return None
    if len(lookup_keys) != len(keys) or lookup_keys[length - 1] != keys[length - 1]:
        return None
    messages = list(rewritten[:length])
    for index in record.unrecorded:  # a few: most are recorded
        if index < length:
            messages[index] = client[index]
    below = bisect.bisect_left(record.at, length)
    return Carried(
        client,
        length,
        keys[length - 1],
        messages,
        record.at[:below],
        record.substituted[:below],
    )


def saved(session: Session) -> tuple[int, bytes]:
    """A record as saved: its version, and the last link of the chain it remembers."""
    return session.version, session.last_chain[-1] if session.last_chain else b""


def _carried(
    known: Known | None, session: Session, messages: list[Any], keys: Sequence[bytes]
) -> Carried | None:
    """The previous request's result for this one, where it holds: the record is the one
    that request saved (no other request recorded since), and it ``continues`` there."""
    carry = known.restore_next if known is not None else None
    if carry is None or carry.saved is None or carry.saved != saved(session):
        return None
    return carry if continues(carry, known, messages, keys) else None


def continues(
    carry: Carried, known: Known | None, messages: Sequence[Any], keys: Sequence[bytes]
) -> bool:
    """Whether a request's leading messages (keyed ``keys``) are the very objects of the
    history ``carry`` was worked out for (proxy.bodies), with the same keys up to there."""
    lead = known.lead if known is not None else None
    if lead is None or lead[0] is not messages or lead[1] is not carry.client:
        return False
    if min(lead[2], len(messages) - 1, len(keys)) < carry.length:
        return False
    return keys[carry.length - 1] == carry.last_key
