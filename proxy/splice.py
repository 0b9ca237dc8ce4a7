"""The forwarded body from the client's own bytes: only what the proxy changed is encoded.

An agent's request is mostly history the proxy passes on untouched (a 1 MB body: about 100
messages, of which a rewrite replaces one or two). Encoding all of it again is the largest
cost of a big request that was rewritten (1.2 ms at 1 MB, tests/benchmarks/overhead.py);
the client's bytes of each untouched message are already valid JSON of the same value. So
the messages of the forwarded request that are the client's own objects (the transforms
never change a message in place, they replace it) go as the client's bytes, found by a C
scan (msgspec's ``Raw``: the span of each message, not parsed), and the rest is encoded as
before. What reaches the engine parses to the same request as the whole encode; only the
client's spacing and escapes are kept in the untouched messages. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

from proxy import jsonio

# Below this the whole encode costs less than scan plus splice (the agent bodies of
# tests/benchmarks/overhead.py, best of 40: 64 KB 0.052 ms whole, 0.057 spliced; 256 KB
# 0.258 against 0.151; 1 MB 1.047 against 0.520).
MIN_BYTES = 128 << 10


class _Messages(msgspec.Struct):
    """Only the ``messages`` array, each element as its raw bytes; other fields skipped."""

    messages: list[msgspec.Raw] = []


_SCAN = msgspec.json.Decoder(_Messages)


def message_spans(body: bytes) -> list[msgspec.Raw] | None:
    """The raw bytes of each element of the body's ``messages`` array; None if the body is
    not a JSON object with a messages array that msgspec reads (NaN literals, ...)."""
    try:
        return _SCAN.decode(body).messages
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def encode(forwarded: dict[str, Any], client_messages: Any, body: bytes) -> bytes:
    """``forwarded`` as JSON, its messages that are ``client_messages``' own objects as the
    client's bytes of them (``body``: the client's request, which ``client_messages`` were
    parsed from). Raises jsonio.InvalidJSON as jsonio.dumps does."""
    messages = forwarded.get("messages")
    if (
        len(body) < MIN_BYTES
        or not isinstance(messages, list)
        or not isinstance(client_messages, list)
    ):
        return jsonio.dumps(forwarded)
    spans = message_spans(body)
    if spans is None or len(spans) != len(client_messages):
        return jsonio.dumps(forwarded)
    raw = {id(message): span for message, span in zip(client_messages, spans, strict=True)}
    spliced = [
        orjson.Fragment(bytes(span)) if (span := raw.get(id(message))) is not None else message
        for message in messages
    ]
    try:
        return orjson.dumps({**forwarded, "messages": spliced})
    except TypeError:  # what orjson cannot write (a huge integer, deep nesting): as before
        return jsonio.dumps(forwarded)
