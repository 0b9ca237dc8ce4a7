"""The forwarded body from the client's own bytes: only what the proxy changed is encoded.

An agent's request is mostly history the proxy passes on untouched (a 1 MB body: about 100
messages, of which a rewrite replaces one or two). Encoding all of it again is the largest
cost of a big request that was rewritten (0.9 ms at 1 MB, tests/benchmarks/overhead.py);
the client's bytes of each untouched message are already valid JSON of the same value. So
the messages of the forwarded request that are the client's own objects (the transforms
never change a message in place, they replace it) go as the client's bytes, each run of
consecutive ones as one slice of the body, joined with the rest, encoded: the history is
copied once. Where each message's bytes are is known when the body was parsed as the
continuation of an earlier one (proxy.bodies); otherwise a big body is scanned for them
(``bodies.message_spans``). What reaches the engine parses to the same request as the
whole encode; only the client's spacing and escapes are kept in and between the untouched
messages, and it is the same bytes whichever way the spans were found. On the request
path the pieces are not even joined (``encode_pieces``, proxy.pieces): they go to the
engine's socket as they are, and the history is not copied at all. The exception is a
history with many messages replaced (every reply restored): its array is joined once and
kept for the conversation's next request, which takes its bytes (proxy.encoded) rather
than encoding and slicing message by message again. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import orjson

from proxy import bodies, encoded, jsonio, tool_forms
from proxy.identity import ByIdentity
from proxy.known import Known
from proxy.pieces import Body, Pieces, joined
from proxy.scans import replaced, same_objects

_MISSING = object()
_SPACE = b" \t\n\r"

# Below this, without the spans known, the whole encode costs less than finding them
# (msgspec's scan, most of bodies.message_spans) plus the splice (the agent bodies of
# tests/benchmarks/overhead.py, best of 40: 64 KB 0.052 ms whole, 0.057 spliced; 256 KB
# 0.258 against 0.151; 1 MB 1.047 against 0.520; measured with the per-message splice).
MIN_BYTES = 128 << 10

# Where a forwarded list holds other objects than the client's (proxy.turn.Turn).
ReplacedIn = Callable[[list[Any]], Sequence[int]]


def encode(
    forwarded: dict[str, Any],
    client_messages: Any,
    body: bytes,
    spans: Sequence[bodies.Span] | None = None,
    client: dict[str, Any] | None = None,
) -> bytes:
    """``encode_pieces``, joined."""
    return joined(encode_pieces(forwarded, client_messages, body, spans, client))


def encode_pieces(
    forwarded: dict[str, Any],
    client_messages: Any,
    body: bytes,
    spans: Sequence[bodies.Span] | None = None,
    client: dict[str, Any] | None = None,
    replaced_in: ReplacedIn | None = None,
    known: Known | None = None,
) -> Body:
    """``forwarded`` as JSON, its messages that are ``client_messages``' own objects as the
    client's bytes of them (``body``: the client's request, which ``client_messages`` were
    parsed from; ``spans``: where each of them is in it, if known). Where the rewrites
    only added top-level fields to ``client`` (the parse of ``body``), the client's bytes
    with those fields. ``replaced_in``: where a list of as many messages holds other
    objects than ``client_messages``, if the caller works that out once for several
    uses (proxy.turn.Turn). ``known``: what the body cache carries of the conversation
    (proxy.known.Known), which keeps the forwarded array for the next request where
    many messages are replaced (proxy.encoded). Raises jsonio.InvalidJSON as
    jsonio.dumps does."""
    if client is not None and (extended := _extended(forwarded, client, body)) is not None:
        return extended
    messages = forwarded.get("messages")
    if not isinstance(messages, list) or not isinstance(client_messages, list):
        return jsonio.dumps(forwarded)
    if spans is None and len(body) >= MIN_BYTES:
        found = bodies.message_spans(body)
        spans = None if found is None else found[1]
    if spans is None or len(spans) != len(client_messages):
        return jsonio.dumps(forwarded)
    try:
        return _joined(forwarded, messages, client_messages, body, spans, replaced_in, known)
    except TypeError:  # what orjson cannot write (a huge integer, deep nesting): as before
        return jsonio.dumps(forwarded)


def _extended(forwarded: dict[str, Any], client: dict[str, Any], body: bytes) -> Body | None:
    """``body`` with the fields ``forwarded`` adds written before its closing brace, where
    every field of ``client`` is still its own object (its messages may be a new list of
    the same objects): a request the rewrites only asked ``parallel_tool_calls`` or
    ``stream_options`` of goes as the client's bytes plus those, with no encode of its
    history. None where anything else changed."""
    for key, value in client.items():
        now = forwarded.get(key, _MISSING)
        if now is not value and not (key == "messages" and _same_list(now, value)):
            return None
    end = len(body)
    while end and body[end - 1] in _SPACE:
        end -= 1
    if not end or body[end - 1] != ord("}"):
        return None
    try:
        added = [
            orjson.dumps(key) + b":" + orjson.dumps(value)
            for key, value in forwarded.items()
            if key not in client
        ]
    except TypeError:  # what orjson cannot write: the encode path decides
        return None
    if not added:
        return body
    head = memoryview(body)[: end - 1]  # the client's bytes, not copied
    return Pieces((head, b"," if client else b"", b",".join(added), b"}"), (0, -1, -1, -1))


def _same_list(now: Any, before: Any) -> bool:
    return isinstance(now, list) and isinstance(before, list) and same_objects(now, before)


def _joined(
    forwarded: dict[str, Any],
    messages: list[Any],
    client_messages: list[Any],
    body: bytes,
    spans: Sequence[bodies.Span],
    replaced_in: ReplacedIn | None = None,
    known: Known | None = None,
) -> Pieces:
    """``forwarded`` with each run of consecutive client messages as one slice of ``body``
    (``spans``: theirs in it), not copied; the other messages and fields encoded. A
    history with a rewritten system prompt and one message that carries a note is three
    runs and two encoded messages. One with many replaced (restored replies) is built
    from the array the conversation's last request forwarded, where ``known`` has it."""
    view = memoryview(body)
    if len(messages) == len(client_messages):
        prior = None if known is None else known.encoded
        at: Sequence[int] = ()
        if prior is None:
            at = replaced_in(messages) if replaced_in else list(replaced(messages, client_messages))
        many = prior is not None or len(at) >= encoded.MIN_REPLACED
        if known is not None and messages and many:
            array = known.encoded = encoded.encode(messages, client_messages, view, spans, prior)
            elements: Elements = [(array.array, -1)]
        else:
            elements = _in_place(messages, at, view, spans)
    else:
        elements = _runs(messages, client_messages, view, spans)
    parts: list[bytes | memoryview] = []
    origins: list[int] = []  # where each part is in ``body``; -1: encoded
    history_end = -1
    for key, value in forwarded.items():
        parts += (b",", orjson.dumps(key), b":[" if key == "messages" else b":")
        origins += (-1, -1, -1)
        if key == "messages":
            for element, origin in elements:
                parts += (element, b",")
                origins += (origin, -1)
            if elements:
                parts.pop()
                origins.pop()
            history_end = sum(map(len, parts))
            parts.append(b"]")
            origins.append(-1)
            continue
        if key == "tools" and isinstance(value, list):
            # Encoded once per list object (every step brings the same canonical list).
            parts.append(tool_forms.forms(value).encoded or orjson.dumps(value))
        else:
            parts.append(orjson.dumps(value))
        origins.append(-1)
    parts[0] = b"{"
    parts.append(b"}")
    origins.append(-1)
    return Pieces(parts, origins, history_end)


# Each a run of client messages' bytes and where it starts in their body, or one message
# encoded (-1).
Elements = list[tuple[bytes | memoryview, int]]


# Encodings of the messages the rewrites made, by identity: a system prompt with its clock
# moved out is the same object step to step (proxy.rewrite.volatile), 8 KB encoded afresh
# on every step without this. Bounded: 128 of at most 64 KB each.
_ENCODED: ByIdentity[bytes] = ByIdentity(128)
ENCODED_KEPT_BYTES = 64 << 10


def _encoded(message: Any) -> bytes:
    encoded = _ENCODED.get(message)
    if encoded is None:
        encoded = orjson.dumps(message)
        if len(encoded) <= ENCODED_KEPT_BYTES:
            _ENCODED.put(message, encoded)
    return encoded


def _in_place(
    messages: list[Any], replaced_at: Iterable[int], view: memoryview, spans: Sequence[bodies.Span]
) -> Elements:
    """The elements of a forwarded list as long as the client's (nothing dropped), given
    where the rewrites replaced a message (found in C, scans.replaced): those
    encoded, the runs between them slices."""
    elements: Elements = []
    start = 0  # the run's first message
    for index in replaced_at:
        if index > start:
            elements.append((view[spans[start][0] : spans[index - 1][1]], spans[start][0]))
        elements.append((_encoded(messages[index]), -1))
        start = index + 1
    if start < len(messages):
        elements.append((view[spans[start][0] : spans[-1][1]], spans[start][0]))
    return elements


def _runs(
    messages: list[Any], client_messages: list[Any], view: memoryview, spans: Sequence[bodies.Span]
) -> Elements:
    """The elements of any forwarded list (compaction left messages out): each message
    found among the client's by identity."""
    index = {id(message): n for n, message in enumerate(client_messages)}
    elements: Elements = []
    first = last = -1  # the run being gathered
    for message in messages:
        n = index.get(id(message))
        if n is not None and first >= 0 and n == last + 1:
            last = n
            continue
        if first >= 0:
            elements.append((view[spans[first][0] : spans[last][1]], spans[first][0]))
        first = last = -1 if n is None else n
        if n is None:
            elements.append((orjson.dumps(message), -1))
    if first >= 0:
        elements.append((view[spans[first][0] : spans[last][1]], spans[first][0]))
    return elements
