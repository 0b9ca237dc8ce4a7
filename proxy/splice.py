"""The forwarded body from the client's own bytes: only what the proxy changed is encoded.

An agent's request is mostly history the proxy passes on untouched (a 1 MB body: about 100
messages, of which a rewrite replaces one or two). Encoding all of it again is the largest
cost of a big request that was rewritten (0.9 ms at 1 MB, tests/benchmarks/overhead.py);
the client's bytes of each untouched message are already valid JSON of the same value. So
the messages of the forwarded request that are the client's own objects (the transforms
never change a message in place, they replace it) go as the client's bytes, and the rest
is encoded as before. Where each message's bytes are is known when the body was parsed as
the continuation of an earlier one (proxy.bodies); otherwise a big body is scanned for
them (msgspec's ``Raw``). What reaches the engine parses to the same request as the whole
encode; only the client's spacing and escapes are kept in the untouched messages. Pure:
no I/O.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from proxy import bodies, jsonio

_MISSING = object()
_SPACE = b" \t\n\r"

# Below this, without the spans known, the whole encode costs less than a scan plus the
# splice (the agent bodies of tests/benchmarks/overhead.py, best of 40: 64 KB 0.052 ms
# whole, 0.057 spliced; 256 KB 0.258 against 0.151; 1 MB 1.047 against 0.520).
MIN_BYTES = 128 << 10


def encode(
    forwarded: dict[str, Any],
    client_messages: Any,
    body: bytes,
    spans: Sequence[bodies.Span] | None = None,
    client: dict[str, Any] | None = None,
) -> bytes:
    """``forwarded`` as JSON, its messages that are ``client_messages``' own objects as the
    client's bytes of them (``body``: the client's request, which ``client_messages`` were
    parsed from; ``spans``: where each of them is in it, if known). Where the rewrites
    only added top-level fields to ``client`` (the parse of ``body``), the client's bytes
    with those fields. Raises jsonio.InvalidJSON as jsonio.dumps does."""
    if client is not None and (extended := _extended(forwarded, client, body)) is not None:
        return extended
    messages = forwarded.get("messages")
    if not isinstance(messages, list) or not isinstance(client_messages, list):
        return jsonio.dumps(forwarded)
    if (
        spans is not None
        and len(spans) == len(messages)
        and _same_objects(messages, client_messages)
    ):
        with contextlib.suppress(TypeError):  # what orjson cannot write: as below
            return _around_messages(forwarded, body, spans)
    piece = _pieces(body, len(client_messages), spans)
    if piece is None:
        return jsonio.dumps(forwarded)
    index = {id(message): n for n, message in enumerate(client_messages)}
    spliced = [
        orjson.Fragment(piece(n)) if (n := index.get(id(message))) is not None else message
        for message in messages
    ]
    try:
        return orjson.dumps({**forwarded, "messages": spliced})
    except TypeError:  # what orjson cannot write (a huge integer, deep nesting): as before
        return jsonio.dumps(forwarded)


def _extended(forwarded: dict[str, Any], client: dict[str, Any], body: bytes) -> bytes | None:
    """``body`` with the fields ``forwarded`` adds written before its closing brace, where
    every field of ``client`` is still its own object (its messages may be a new list of
    the same objects): a request the rewrites only asked ``parallel_tool_calls`` or
    ``stream_options`` of goes as the client's bytes plus those, with no encode of its
    history. None where anything else changed."""
    for key, value in client.items():
        now = forwarded.get(key, _MISSING)
        if now is not value and not (key == "messages" and _same_objects(now, value)):
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
    head = memoryview(body)[: end - 1]  # one copy of the client's bytes, in the join
    return b"".join((head, b"," if client else b"", b",".join(added), b"}"))


def _around_messages(forwarded: dict[str, Any], body: bytes, spans: Sequence[bodies.Span]) -> bytes:
    """``forwarded`` whose messages are all the client's, in order (``spans``: theirs in
    ``body``): its other fields encoded (the canonical tools, a new parameter), and the
    client's messages array copied once, as one run of its bytes."""
    parts: list[bytes | memoryview] = []
    for key, value in forwarded.items():
        parts += (b",", orjson.dumps(key), b":")
        if key == "messages" and spans:
            parts += (b"[", memoryview(body)[spans[0][0] : spans[-1][1]], b"]")
        else:
            parts.append(orjson.dumps(value))
    parts[0] = b"{"
    parts.append(b"}")
    return b"".join(parts)


def _same_objects(now: Any, before: Any) -> bool:
    return (
        isinstance(now, list)
        and isinstance(before, list)
        and len(now) == len(before)
        and all(a is b for a, b in zip(now, before, strict=True))
    )


def _pieces(
    body: bytes, count: int, spans: Sequence[bodies.Span] | None
) -> Callable[[int], bytes] | None:
    """The client's bytes of message n, or None where they are not known."""
    if spans is not None and len(spans) == count:
        return lambda n: body[spans[n][0] : spans[n][1]]
    if len(body) < MIN_BYTES:
        return None
    raws = bodies.scan(body)
    if raws is None or len(raws) != count:
        return None
    return lambda n: bytes(raws[n])
