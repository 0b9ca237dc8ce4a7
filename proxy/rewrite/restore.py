"""History restoration: messages the client sends back changed only in form are replaced by
what the proxy forwarded (or the engine emitted) for them before, byte for byte."""

from __future__ import annotations

import itertools
import operator
from typing import Any

from proxy.rewrite.pipeline import Request, RewriteContext, transform
from proxy.transcript import Known, Restored, chain_keys


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
    # afresh (a retry gets the same bytes again from the same transforms). The messages
    # with a substitution are found at C speed (a long history has thousands without).
    history = keys[: len(messages) - 1]
    found = list(
        itertools.compress(range(len(history)), map(substitutions.__contains__, history))
    )
    if not found:
        return None
    recorded = list(map(substitutions.__getitem__, map(history.__getitem__, found)))
    given = list(map(messages.__getitem__, found))
    differs = _differs(found, recorded, given, context.known)
    restored = None
    for at in itertools.compress(range(len(found)), differs):
        restored = restored if restored is not None else list(messages)
        restored[found[at]] = recorded[at]
    return None if restored is None else {**request, "messages": restored}


def _differs(
    found: list[int], recorded: list[Any], given: list[Any], known: Known | None
) -> list[bool]:
    """Whether each recorded form differs from the client's message. A client that sends
    the model's replies back as it got them has one found per step, each equal to its
    record: comparing them deeply was 300 us a step at 2,100 messages. The comparisons
    of the request this one continues (``known``) hold for the leading ones where the
    places, the records and the client's messages are the same (compared in C, the
    very objects at once: records and parsed messages are carried from step to step)."""
    carried: Restored | None = known.restored if known is not None else None
    count = _same_lead(carried, found, recorded, given) if carried is not None else 0
    differs = carried[3][:count] if carried is not None and count else []
    differs += map(operator.ne, recorded[count:], given[count:])
    if known is not None:
        known.restored = (found, recorded, given, differs)
    return differs


def _same_lead(carried: Restored, found: list[int], recorded: list[Any], given: list[Any]) -> int:
    """How many leading comparisons of ``carried`` hold here: all of them, or none (most
    steps only add to the end; a step that changes one is rare enough to compare anew).
    Both ends are checked for identity first, so records loaded afresh from a shared
    store are not compared deeply twice."""
    before_found, before_recorded, before_given, _ = carried
    count = len(before_found)
    if not count or count > len(found):
        return 0
    for now, before in ((recorded, before_recorded), (given, before_given)):
        if now[0] is not before[0] or now[count - 1] is not before[count - 1]:
            return 0
    if found[:count] != before_found or given[:count] != before_given:
        return 0
    return count if recorded[:count] == before_recorded else 0
