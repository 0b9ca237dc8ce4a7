"""What a request worked out of its parsed messages, carried with its body (proxy.bodies) to
the request that continues it: the messages' content hashes and digests, the chains over
its lists, the scans of its lists for roles. The leading messages of a session's next
request are the same objects, so what was worked out for them is looked up by identity,
not worked out again. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from proxy.scans import role, starts_with, with_role

if TYPE_CHECKING:
    from proxy.encoded import Encoded
    from proxy.rewrite.restore import Carried

# Parsed messages' content hashes and digests by object: id -> (the object, kept alive, its
# content hash, its digests: [exact, key], None where not worked out yet).
Hashes = dict[int, tuple[Any, int, list[bytes | None]]]
# A chain worked out over a list of messages: (the list, what it was keyed with, the chain).
Chain = tuple[Sequence[Any], Any, list[bytes]]
# The scans of a list of messages for roles: (the list, if it is the parsed array, else a copy
# of it; the indices of the messages with each set of roles looked for).
Scan = tuple[list[Any], dict[frozenset[str], tuple[int, ...]]]
# A fingerprint worked out (proxy.sessions), by its form (with the first user message, with
# the system prompt): (the tools, the messages up to the first user message, the mask, the
# key), good for a request with those tools (the very object) and messages.
Head = tuple[Any, list[Any], Any, str]
# Content hashes of objects a conversation's requests no longer hold, kept at most (each
# holds its object: a rewritten system prompt) before they are dropped (Known.continued).
STALE_HASHES = 32


class Known:
    """What a request worked out of its parsed messages, carried with its body (proxy.bodies)
    to the request that continues it, whose leading messages are the same objects: their
    content hashes and digests, the chains over the request's lists (``before``: those of
    the request it continues; ``chains``: its own, for the next one), objects made from
    parsed ones (``converted``: the chat messages of Responses items, by the id of what they
    were made from, kept with it), the latest scans of each list the request's passes look
    through for roles (``scans``, by the list's name), history restoration's result for the
    next request (``restore_next``), the array of messages it forwarded, where that is kept
    (``encoded``, proxy.encoded), and its session fingerprints (``heads``). ``array``: the
    request's parsed array, where the body cache parsed it: the cache shares it with the
    request that continues the body, so it is never changed, and a scan keeps it as it is.
    ``lead``: (that array, the one it continues, how many leading elements of the first are
    the second's very objects), where the body cache knows it: a chain or scan over that
    array does not check those one by one."""

    __slots__ = (
        "array",
        "before",
        "chains",
        "converted",
        "encoded",
        "hashes",
        "heads",
        "lead",
        "restore_next",
        "scans",
    )

    def __init__(
        self,
        hashes: Hashes | None = None,
        before: dict[str, Chain] | None = None,
        converted: dict[int, tuple[Any, Any]] | None = None,
        scans: dict[str, Scan] | None = None,
    ):
        self.hashes: Hashes = {} if hashes is None else hashes
        self.before: dict[str, Chain] = {} if before is None else before
        self.chains: dict[str, Chain] = {}
        self.converted: dict[int, tuple[Any, Any]] = {} if converted is None else converted
        self.scans: dict[str, Scan] = {} if scans is None else scans
        self.array: Sequence[Any] | None = None
        self.lead: tuple[Sequence[Any], Sequence[Any], int] | None = None
        self.restore_next: Carried | None = None
        self.encoded: Encoded | None = None
        self.heads: dict[tuple[bool, bool], Head] = {}

    def with_role(self, name: str, messages: list[Any], roles: frozenset[str]) -> Sequence[int]:
        """``with_role(messages, roles)``, looked for only past the list named ``name`` (the
        client's messages, the rewritten ones) was scanned in last, by this request or the
        one it continues, where ``messages`` starts with that list: a step of a long session
        scans its new messages, not the history (3,400 messages: 174 us a scan). Every set of
        roles a list was scanned for is carried on with it, so the passes that look in one
        list for different roles compare it with the one before, and read its new messages'
        roles, once."""
        scan = self.scans.get(name)
        if scan is None or not self._continues(messages, scan[0]):
            found = tuple(with_role(messages, roles))
            self.scans[name] = (self._kept(messages), {roles: found})
            return found
        before, by_roles = scan
        count = len(before)
        if len(messages) > count:
            new = [its if type(its) is str else None for its in map(role, messages[count:])]
            present = set(new)  # most steps add no message of most of the roles looked for
            by_roles = {
                each: old if each.isdisjoint(present) else _found_after(old, count, new, each)
                for each, old in by_roles.items()
            }
            self.scans[name] = scan = (self._kept(messages), by_roles)
        known = by_roles.get(roles)
        if known is not None:
            return known
        found = tuple(with_role(messages, roles))  # not looked for in this list before
        self.scans[name] = (scan[0], {**by_roles, roles: found})
        return found

    def _continues(self, messages: list[Any], before: list[Any]) -> bool:
        """Whether ``messages`` starts with the objects of ``before``: known without looking
        where both are parsed arrays the body cache says so of (a long history's slice and
        comparison touch every one of its objects: 1,900 messages, 20 us), else compared."""
        if messages is self.array:
            if before is messages:
                return True
            lead = self.lead
            if lead is not None and before is lead[1] and lead[2] >= len(before):
                return True
        return starts_with(messages, before)

    def _kept(self, messages: list[Any]) -> list[Any]:
        """The list a scan is kept with: the parsed array itself (never changed), else a
        copy (another list may be changed after the scan)."""
        return messages if messages is self.array else list(messages)

    def continued(
        self,
        elements: Sequence[Any],
        others: Iterable[Any] = (),
        lead: tuple[Sequence[Any], int] | None = None,
    ) -> Known:
        """What the request continuing this one starts with (``elements``: its parsed
        array; ``others``: its other top-level values; ``lead``: the array it continues
        and how many of ``elements`` lead with its objects, if known): what was made from
        the objects it shares, their hashes, and this request's chains."""
        present: set[int] | None = None
        converted: dict[int, tuple[Any, Any]] = {}
        if self.converted:
            present = _ids(elements, others)
            converted = {i: made for i, made in self.converted.items() if i in present}
            present.update(id(made[1]) for made in converted.values())
        # Shared, not copied (2,100 entries a step at 1 MB): an entry is only ever used for
        # the very object it holds, so what another request adds to it does no harm.
        hashes = self.hashes
        # Most are of objects the continuing request has. Those of objects it no longer has
        # (a replaced message, a rewritten copy: a few a step) are dropped once STALE_HASHES
        # have gathered, not on every request (a pass over the whole history).
        if len(hashes) > len(elements) + len(converted) + STALE_HASHES:
            present = _ids(elements, others) if present is None else present
            hashes = {i: known for i, known in hashes.items() if i in present}
        # Chains and scans copied: a chain taken from it is gone, and another conversation's
        # request may continue the same body (proxy.bodies keeps it then).
        known = Known(hashes, dict(self.chains), converted, dict(self.scans))
        known.restore_next, known.encoded = self.restore_next, self.encoded
        known.heads = dict(self.heads)
        known.array = elements
        if lead is not None:
            known.lead = (elements, *lead)
        return known


def _found_after(
    found: tuple[int, ...], count: int, new_roles: list[Any], roles: frozenset[str]
) -> tuple[int, ...]:
    """``found`` and the indices of the roles of ``new_roles`` (those of the messages after
    the ``count`` scanned, None where not a string) that are among ``roles``."""
    return (*found, *[count + i for i, its in enumerate(new_roles) if its in roles])


def _ids(elements: Sequence[Any], others: Iterable[Any]) -> set[int]:
    present = set(map(id, elements))  # in C: a long history's thousands of messages
    present.update(map(id, others))
    return present
