"""A forwarded array of messages as bytes, carried to the conversation's next request.

A client that sends its replies back in another form (the OpenAI SDK re-dumps every tool
call) has one message restored for each reply it got: at 1 MB, some 1,700 of 3,400
messages are not the client's own objects, and the splice (proxy.splice) encoded each
of them and cut a slice of the body between each two, on every step: work that grows
with the history, for bytes the previous step already made. Here a request's forwarded
array is kept whole, with where each message is in it, and the next request's is built
from it: the messages that are the very objects the previous one forwarded at the same
place take its bytes, a range at a time; only the others (the new ones, a system prompt
rewritten afresh) are encoded. The result is the bytes the splice makes without it.

Why the same bytes: the splice writes a message as the client's bytes of it when it is
the client's own object, and encoded otherwise; an object the body cache (proxy.bodies)
carries to the next request is that request's client object at the same place, parsed
from the same bytes, and one the rewrites made (a restored reply) is no client's object
in either. Between two messages go the client's bytes where both are its own objects (one
run of its body), else a comma. So an object forwarded at the same place both times is
written the same both times, with the same bytes before it (tests/unit/test_encoded.py
runs both on the same sessions). Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

import orjson

from proxy.bodies import Span
from proxy.scans import replaced

# Positions where the next request may hold other objects than this one's and still take
# this one's bytes for the rest; past that it is not the same conversation's next step,
# and its array is built from the client's bytes.
MAX_CHANGED = 32

# Fewer replaced messages than this are cheaper to splice one by one (proxy.splice) than
# to keep a copy of the array for.
MIN_REPLACED = 16


@dataclasses.dataclass(frozen=True, eq=False)
class Encoded:
    """A forwarded list of messages (never changed in place: the rewrites replace, they
    do not edit) and its JSON array's elements as they went, joined (``array``: what is
    between the brackets); message ``i`` is ``array[starts[i]:ends[i]]``."""

    messages: list[Any]
    array: bytes
    starts: list[int]
    ends: list[int]


def encode(
    messages: list[Any],
    client: list[Any],
    body: memoryview,
    spans: Sequence[Span],
    prior: Encoded | None = None,
) -> Encoded:
    """``messages`` (as many as ``client``, the client's parsed list; ``spans``: where
    each of those is in ``body``) as the splice writes them, taking ``prior``'s bytes for
    the messages that are the very objects it holds at the same place."""
    builder = _Builder(messages, client, body, spans)
    fresh_from = 0
    if prior is not None:
        changed = list(itertools.islice(replaced(messages, prior.messages), MAX_CHANGED + 1))
        if len(changed) <= MAX_CHANGED:
            fresh_from = min(len(prior.messages), len(messages))
            start = 0
            for index in changed:  # (all before fresh_from: replaced stops at the shorter)
                builder.taken(prior, start, index)
                builder.fresh(index, index + 1)
                start = index + 1
            builder.taken(prior, start, fresh_from)
    builder.fresh(fresh_from, len(messages))
    return builder.done()


class _Builder:
    """The array, message by message or a range at a time, and where each message is."""

    def __init__(
        self, messages: list[Any], client: list[Any], body: memoryview, spans: Sequence[Span]
    ) -> None:
        self.messages, self.client, self.body, self.spans = messages, client, body, spans
        self.chunks: list[bytes | memoryview] = []
        self.size = 0
        self.starts: list[int] = []
        self.ends: list[int] = []

    def _put(self, chunk: bytes | memoryview) -> None:
        self.chunks.append(chunk)
        self.size += len(chunk)

    def _gap(self, index: int) -> None:
        """What goes before message ``index``: the client's bytes between it and the one
        before where both are the client's objects (the splice sends them as one slice of
        its body), else a comma."""
        if not index:
            return
        before, spans = index - 1, self.spans
        messages, client = self.messages, self.client
        if messages[before] is client[before] and messages[index] is client[index]:
            self._put(self.body[spans[before][1] : spans[index][0]])
        else:
            self._put(b",")

    def taken(self, prior: Encoded, start: int, stop: int) -> None:
        """Messages ``start`` to ``stop`` as ``prior`` has their bytes."""
        if stop <= start:
            return
        self._gap(start)
        first = prior.starts[start]
        shift = self.size - first
        starts, ends = prior.starts[start:stop], prior.ends[start:stop]
        if shift:  # a message before them was written at another length this time
            starts = [at + shift for at in starts]
            ends = [at + shift for at in ends]
        self.starts += starts
        self.ends += ends
        self._put(memoryview(prior.array)[first : prior.ends[stop - 1]])

    def fresh(self, start: int, stop: int) -> None:
        """Messages ``start`` to ``stop`` as the splice writes them: each run of the
        client's objects as one slice of its body, the others encoded."""
        messages, client, spans = self.messages, self.client, self.spans
        found = replaced(messages[start:stop], client[start:stop])
        for index in itertools.chain(map(start.__add__, found), [stop]):
            if index > start:  # the client's own, start to index: one slice of its body
                self._gap(start)
                shift = self.size - spans[start][0]
                run = spans[start:index]
                self.starts += [first + shift for first, _ in run]
                self.ends += [last + shift for _, last in run]
                self._put(self.body[spans[start][0] : spans[index - 1][1]])
            if index < stop:
                self._gap(index)
                self.starts.append(self.size)
                self._put(orjson.dumps(messages[index]))
                self.ends.append(self.size)
            start = index + 1

    def done(self) -> Encoded:
        return Encoded(self.messages, b"".join(self.chunks), self.starts, self.ends)
