"""Chat request bodies parsed in proportion to what is new.

An agent re-sends its whole history every step: a 1 MB body is the previous body plus a
tool call and its result. Parsing all of it again (orjson, about 1 ms per MB here) and
scanning it for the splice (msgspec, 0.8 ms per MB) was most of the proxy's work on a big
request. So recent bodies are kept up to the end of their last message, with their parse
and each message's byte span. A body that starts with exactly those bytes (one memcmp:
0.02 ms per MB) continues that body. A JSON prefix parses to the same values whatever
follows it, so its messages are the earlier parse's objects (nobody changes a parsed
request in place: the rewrites replace messages, they never mutate them), and only the
rest is parsed, in the same place of the grammar: inside the top-level object's
``messages`` array, after an element. A body that differs from a kept one in one message
(a clock in the system prompt) has the messages after that one found again nearby and
compared byte for byte; then only the changed message is parsed besides the new part.
What follows the messages (openai-python and the AI SDK put the tools there) is kept too:
a body that ends with the same bytes takes its values from the kept one, so only the new
messages are parsed, and the tools are the same objects step to step. The result is what
``orjson.loads(body)`` gives: the same values, types and key order
(tests/unit/test_bodies.py).

Kept per credential (a body is only ever continued from one sent with the same
``Authorization``), bounded in bytes, least recently used dropped. Where each message's
bytes are is proxy.body_spans's. Pure: no I/O.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import secrets
from collections.abc import Iterator
from typing import Any, NamedTuple

from proxy import jsonio
from proxy.body_spans import INPUT, MESSAGES, Array, Span, message_spans, scan, walk
from proxy.known import Known
from proxy.pieces import Lead
from proxy.scans import role

__all__ = [
    "CHANGED_TRIES",
    "HEAD",
    "INPUT",
    "MESSAGES",
    "MIN_BODY",
    "PROBE",
    "SHORT_KEPT",
    "WINDOW",
    "Array",
    "BodyCache",
    "Kept",
    "Parsed",
    "Span",
    "Tail",
    "message_spans",
    "scan",
]

# Bodies shorter than this are parsed whole and not kept: a 32 KB parse costs 0.03 ms.
MIN_BODY = 32 << 10
# Bodies are grouped by their first bytes (a system prompt's start), digits read as 0 (a
# clock there does not move a body to another group). Within a group, kept bodies are
# found by their PROBE bytes from where their second message starts (where conversations
# on one system prompt and tools part: their first user message), so a request finds the
# body it continues among any number of conversations on one agent's prompt.
HEAD = 512
PROBE = 256
# A body whose messages end before a whole probe (a conversation's first request, a short
# user message) is tried one by one: a group keeps the most recent SHORT_KEPT of those.
SHORT_KEPT = 64
_DIGITS = bytes.maketrans(b"0123456789", b"0" * 10)
# How far a changed message may have grown for the messages after it to be found again.
WINDOW = 4096
# Kept bodies of its group a body is tried against as one with a changed message (a few
# finds each, where the append check is one memcmp): the most recent, so a new
# conversation's first request does not try every conversation sharing its system prompt.
CHANGED_TRIES = 16
_SPACE = b" \t\n\r"


def _before(head: bytes, key: str, payload: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The top-level items a body's bytes up to its first element hold (``head`` ends with
    the array's opening), as parsing just those bytes gives them: a key written again
    after the array is not theirs. Where ``payload`` (the whole body's parse) holds the
    same value, its object: the next steps then bring the objects this one had (their
    tools, their instructions), which what was made from them is kept by."""
    items = jsonio.loads(head + b"]}").items()
    return tuple((k, _as_parsed(payload.get(k), value)) for k, value in items if k != key)


def _as_parsed(parsed: Any, value: Any) -> Any:
    """``parsed`` where it is ``value`` to the byte (Python's == takes 1 for True)."""
    if type(parsed) is type(value) and jsonio.dumps(parsed) == jsonio.dumps(value):
        return parsed
    return value


class Tail(NamedTuple):
    """What follows a body's messages: its bytes (from the end of the last message: the
    array's closing bracket, the top-level items after it) and those items as parsed."""

    raw: memoryview
    items: tuple[tuple[str, Any], ...]


@dataclasses.dataclass
class Parsed:
    """A body parsed; filled in as the cache works on it (not frozen: a copy per field
    set was 5 us each on a step's request path)."""

    payload: Any  # what orjson.loads(body) gives
    spans: list[Span] | None = None  # each message's bytes in the body, when known
    reused: int = 0  # messages that are an earlier body's parsed objects
    reused_bytes: int = 0  # the bytes of those: not parsed again
    # What is known of the messages (proxy.transcript.Memo fills it in): for the earlier
    # body's objects, what was worked out then. Kept with this body for the next step.
    known: Known | None = None
    kept: Kept | None = None  # this body as the cache keeps it, if it does
    tail: Tail | None = None  # what follows its messages, where it was parsed apart


@dataclasses.dataclass(eq=False)
class Kept:
    """A body up to the end of its last message, and what it parsed to."""

    group: int
    prefix: memoryview  # of the body, not a copy: a fresh megabyte costs its page faults
    probe: tuple[int, bytes] | None  # where its second message starts, PROBE bytes there
    size: int  # of the whole body, which the view keeps
    before: tuple[tuple[str, Any], ...]  # the top-level items before the array
    messages: list[Any]
    spans: list[Span]
    known: Known
    # What its request forwarded up to the end of its messages, and to which engine: a
    # body continuing it can start going there before the proxy has worked on it
    # (``BodyCache.lead``). None: not known, or not to be relied on.
    lead: tuple[Lead, str] | None = None
    # Bytes kept with it besides the body: the array its request forwarded, or the one
    # it carries from the request it continues (proxy.encoded).
    extra: int = 0
    tail: Tail | None = None  # what follows its messages (None: not parsed apart)


class _Group:
    """The kept bodies of one group: in the order they were kept, and by their probe.
    A body whose prefix ends before a whole probe is kept aside and tried as well."""

    def __init__(self) -> None:
        self.members: dict[Kept, None] = {}  # the oldest first
        self.probes: dict[tuple[int, bytes], list[Kept]] = {}
        self.offsets: collections.Counter[int] = collections.Counter()  # probe offsets
        self.short: dict[Kept, None] = {}

    def add(self, kept: Kept) -> Kept | None:
        """Keep ``kept``; the short body it pushes out, if any (for the cache to drop)."""
        self.members[kept] = None
        if kept.probe is None:
            self.short[kept] = None
            return next(iter(self.short)) if len(self.short) > SHORT_KEPT else None
        self.probes.setdefault(kept.probe, []).append(kept)
        self.offsets[kept.probe[0]] += 1
        return None

    def remove(self, kept: Kept) -> None:
        del self.members[kept]
        if kept.probe is None:
            del self.short[kept]
            return
        same = self.probes[kept.probe]
        same.remove(kept)
        if not same:
            del self.probes[kept.probe]
        self.offsets[kept.probe[0]] -= 1
        if not self.offsets[kept.probe[0]]:
            del self.offsets[kept.probe[0]]

    def continued_by(self, body: bytes) -> Iterator[Kept]:
        """The kept bodies ``body`` may continue (the most recent first): those whose probe
        it has where theirs is, and the short ones."""
        for at in self.offsets:
            yield from reversed(self.probes.get((at, body[at : at + PROBE]), ()))
        yield from reversed(self.short)

    def recent(self, count: int) -> Iterator[Kept]:
        return itertools.islice(reversed(self.members), count)


class BodyCache:
    """Recent chat bodies, so a body that continues one is parsed from where it is new:
    after the kept body's messages, and in the one message it changed (a clock in the
    system prompt). ``max_bytes`` bounds the bodies kept (their parsed messages take about
    as much again); 0 keeps none."""

    def __init__(
        self, max_bytes: int, min_body: int | None = None, array: Array = MESSAGES
    ) -> None:
        self.max_bytes = max_bytes
        self.array = array
        self.min_body = MIN_BODY if min_body is None else min_body
        # Bytes of the bodies kept (whole: their prefixes are views of them), and of what
        # is kept with them.
        self.held = 0
        self._lru: collections.OrderedDict[Kept, None] = collections.OrderedDict()
        self._groups: dict[int, _Group] = {}
        # An array element no client sends: where a body's new part is parsed, it proves
        # the part ended where it was cut.
        self._nonce = b'"prefill-proxy ' + secrets.token_hex(16).encode() + b'"'
        self._open = b"{" + array.quoted + b":["

    def lead(self, body: bytes, credential: bytes = b"") -> tuple[Lead, str] | None:
        """What the request for ``body`` will most likely start with, and to which engine
        it goes: where it appends to a kept body, what that one's request forwarded up to
        the end of its messages, to that request's engine. The proxy keeps a conversation's
        history byte-stable, so the next request starts so too (checked once it is built:
        proxy.call)."""
        if not self.max_bytes or len(body) < self.min_body:
            return None
        members = self._groups.get(self._group(body, credential))
        for kept in members.continued_by(body) if members else ():
            if len(body) > len(kept.prefix) and body.startswith(kept.prefix):
                return kept.lead
        return None

    @staticmethod
    def _group(body: bytes, credential: bytes) -> int:
        return hash((credential, body[:HEAD].translate(_DIGITS)))

    def parse(self, body: bytes, credential: bytes = b"") -> Parsed:
        """``body`` parsed (raises jsonio.InvalidJSON as jsonio.loads does)."""
        if not self.max_bytes or len(body) < self.min_body:
            return Parsed(jsonio.loads(body))
        group = self._group(body, credential)
        members = self._groups.get(group) or _Group()
        parsed, goes_on, lead = None, True, 0
        for kept in members.continued_by(body):  # appended to: one memcmp each
            if len(body) > len(kept.prefix) and body.startswith(kept.prefix):
                parsed = self._extend(
                    kept.before, body, kept.messages, kept.spans, len(kept.prefix), kept.tail
                )
                lead = len(kept.messages)
                break
        else:
            for kept in members.recent(CHANGED_TRIES):  # one message changed
                changed = self._changed(kept, body)
                if changed is not None:
                    parsed, lead = changed  # the kept objects up to the changed one
                    goes_on = not _first_user_message(kept.messages, lead)
                    break
        if parsed is not None:
            # Its conversation goes on in this body, unless this is another conversation
            # (its first user message differs) that shares what follows: that one's own next
            # step still continues the kept body.
            if goes_on:
                self._drop(kept)
            payload = parsed.payload
            known = kept.known.continued(
                payload[self.array.key], payload.values(), (kept.messages, lead)
            )
            parsed.known = known
            return self._keep(group, body, parsed, kept.before)
        payload = jsonio.loads(body)
        found = None
        if isinstance(payload, dict) and isinstance(payload.get(self.array.key), list):
            found = message_spans(body, self.array)
        if found is None:
            return Parsed(payload)
        opened, spans = found
        known = Known()
        known.array = payload[self.array.key]
        parsed = Parsed(payload, spans, known=known)
        return self._keep(group, body, parsed, _before(body[:opened], self.array.key, payload))

    def _extend(
        self,
        before: tuple[tuple[str, Any], ...],
        body: bytes,
        messages: list[Any],
        spans: list[Span],
        cut: int,
        tail: Tail | None = None,
    ) -> Parsed | None:
        """``body`` as the top-level items ``before`` its array, then ``messages`` (kept
        ones, where they are in ``body``: ``spans``, the last ending at ``cut``), then what
        its bytes from ``cut`` on hold: more messages, then the rest of the top-level
        object. None where they do not read so. Where ``body`` ends with the kept body's
        ``tail``, what follows its array, only the new messages are parsed: the rest is the
        kept body's objects (openai-python and the AI SDK send their tools after the
        history: 10 KB parsed again and encoded again, for their forms, every step)."""
        if tail is not None:
            stop = len(body) - len(tail.raw)
            if stop >= cut and body.endswith(tail.raw):
                parsed = self._new_part(before, body, messages, spans, cut, stop, tail.items)
                if parsed is not None:
                    return parsed
        return self._new_part(before, body, messages, spans, cut, len(body), None)

    def _new_part(
        self,
        before: tuple[tuple[str, Any], ...],
        body: bytes,
        messages: list[Any],
        spans: list[Span],
        cut: int,
        stop: int,
        after: tuple[tuple[str, Any], ...] | None,
    ) -> Parsed | None:
        """``_extend`` with ``body[cut:stop]`` parsed: up to the end (``after`` None), or
        up to a tail whose items are ``after``. Then those bytes must be array elements and
        nothing else: the top-level object closed right after them holds the array alone."""
        closed = b"" if after is None else b"]}"
        wrapped = self._open + self._nonce + body[cut:stop] + closed
        try:
            rest = jsonio.loads(wrapped)
        except jsonio.InvalidJSON:
            return None  # parsed whole, for the error to point into the client's body
        key = self.array.key
        new = rest.get(key) if isinstance(rest, dict) else None
        if not isinstance(new, list) or not new or (after is not None and len(rest) != 1):
            return None
        raws = scan(wrapped, self.array)
        if not raws or len(raws) != len(new):
            return None
        if bytes(raws[0]) != self._nonce or new[0] != self._nonce[1:-1].decode():
            return None  # a later key of the array's name replaced it
        found = walk(wrapped, len(self._open), raws)
        if found is None:
            return None
        shift = cut - len(self._open) - len(self._nonce)
        if after is None:  # later keys, and repeated ones: the last wins
            after = tuple((name, value) for name, value in rest.items() if name != key)
        payload = dict(before)
        payload[key] = [*messages, *new[1:]]
        payload.update(after)
        moved = [(start + shift, end + shift) for start, end in found[1:]]
        spans = [*spans, *moved]
        end = spans[-1][1] if spans else cut
        return Parsed(
            payload,
            spans,
            reused=len(messages),
            reused_bytes=cut + len(body) - stop,
            tail=Tail(memoryview(body)[end:], after),
        )

    def _changed(self, kept: Kept, body: bytes) -> tuple[Parsed, int] | None:
        """``body`` as the kept one with one message changed and more appended, and the
        changed message's index; or None.
        The kept messages after the changed one are found again within WINDOW bytes of
        where they were and checked byte for byte; the changed one is parsed alone, and
        parses to one whole element only where it was cut at its real end."""
        prefix, spans = kept.prefix, kept.spans
        index = _same(body, prefix, spans)  # the first message whose bytes differ
        start = spans[index][0]
        if not body.startswith(prefix[:start]):
            return None  # the top of the body changed, or the space between messages
        if index == len(spans) - 1:  # the last one: everything from it on is new
            if not index:
                return None
            extended = self._extend(
                kept.before,
                body,
                kept.messages[:index],
                spans[:index],
                spans[index - 1][1],
                kept.tail,
            )
            return None if extended is None else (extended, index)
        after, end = spans[index + 1][0], spans[-1][1]
        needle = prefix[after : spans[index + 1][1]]
        found = body.find(needle, start + 1, after + WINDOW + len(needle))
        if found < 0 or not body.startswith(prefix[after:], found):
            return None
        segment = body[start:found]  # the changed message, a comma, maybe spaces
        if self.array.quoted in segment:
            return None  # a key of the array's name in it could end it and start another
        try:
            pair = jsonio.loads(self._open + segment + self._nonce + b"]}")[self.array.key]
        except jsonio.InvalidJSON:
            return None
        if len(pair) != 2 or pair[1] != self._nonce[1:-1].decode():
            return None
        changed_end = start + len(segment.rstrip(_SPACE)[:-1].rstrip(_SPACE))
        shift = found - after
        messages = [*kept.messages[:index], pair[0], *kept.messages[index + 1 :]]
        moved = [*spans[:index], (start, changed_end)]
        moved += [(first + shift, last + shift) for first, last in spans[index + 1 :]]
        parsed = self._extend(kept.before, body, messages, moved, end + shift, kept.tail)
        if parsed is None:
            return None
        parsed_bytes = changed_end - start
        parsed.reused, parsed.reused_bytes = len(spans) - 1, parsed.reused_bytes - parsed_bytes
        return parsed, index

    def _keep(
        self, group: int, body: bytes, parsed: Parsed, before: tuple[tuple[str, Any], ...]
    ) -> Parsed:
        """``parsed``, with the body kept (where it is worth keeping)."""
        spans = parsed.spans
        # A body whose messages end within its group's bytes would be looked for in another
        # group (its continuation's first bytes differ there): too small to matter anyway.
        if not spans or spans[-1][1] < HEAD or len(body) > self.max_bytes:
            return parsed
        end = spans[-1][1]
        messages, known = parsed.payload[self.array.key], parsed.known
        if known is None:  # both callers pass what this request's memo fills in
            return parsed
        prefix = memoryview(body)[:end]
        at = spans[1][0] if len(spans) > 1 else spans[0][0]
        probe = (at, body[at : at + PROBE]) if at + PROBE <= end else None
        kept = Kept(group, prefix, probe, len(body), before, messages, spans, known)
        kept.extra, kept.tail = _extra(known), parsed.tail
        self._lru[kept] = None
        members = self._groups.get(group)
        if members is None:  # (not setdefault: it would build a _Group every time)
            members = self._groups[group] = _Group()
        pushed_out = members.add(kept)
        self.held += kept.size + kept.extra
        if pushed_out is not None:
            self._drop(pushed_out)
        while self.held > self.max_bytes:
            self._drop(next(iter(self._lru)))
        parsed.kept = kept
        return parsed

    def recount(self, kept: Kept) -> None:
        """Count ``kept`` again, after its request kept the array it forwarded with it
        (proxy.encoded): against ``max_bytes`` as its body is."""
        if kept not in self._lru:
            return  # dropped already: what it holds goes with it
        extra = _extra(kept.known)
        self.held += extra - kept.extra
        kept.extra = extra
        while self.held > self.max_bytes:
            self._drop(next(iter(self._lru)))

    def _drop(self, kept: Kept) -> None:
        if kept not in self._lru:
            return  # dropped already
        del self._lru[kept]
        self.held -= kept.size + kept.extra
        members = self._groups[kept.group]
        members.remove(kept)
        if not members.members:
            del self._groups[kept.group]


def _extra(known: Known) -> int:
    """The bytes a kept body's request keeps with it: its forwarded array, if any."""
    return len(known.encoded.array) if known.encoded is not None else 0


def _first_user_message(messages: list[Any], index: int) -> bool:
    """Whether ``messages[index]`` is the first user message: what tells conversations
    sharing a system prompt apart."""
    return role(messages[index]) == "user" and all(
        role(message) != "user" for message in messages[:index]
    )


def _same(body: bytes, prefix: memoryview, spans: list[Span]) -> int:
    """How many leading messages of the kept body (not all: the whole prefix differs)
    ``body`` has byte for byte where they were: a binary search over the message ends,
    each check a memcmp that stops at the first differing byte."""
    low, high = 0, len(spans)  # the first low agree; the first high do not all
    while high - low > 1:
        middle = (low + high) // 2
        if body.startswith(prefix[: spans[middle - 1][1]]):
            low = middle
        else:
            high = middle
    return low
