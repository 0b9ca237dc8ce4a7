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

from collections.abc import Callable, Sequence
from typing import Any

import orjson

from proxy import bodies, jsonio

# Below this, without the spans known, the whole encode costs less than a scan plus the
# splice (the agent bodies of tests/benchmarks/overhead.py, best of 40: 64 KB 0.052 ms
# whole, 0.057 spliced; 256 KB 0.258 against 0.151; 1 MB 1.047 against 0.520).
MIN_BYTES = 128 << 10


def encode(
    forwarded: dict[str, Any],
    client_messages: Any,
    body: bytes,
    spans: Sequence[bodies.Span] | None = None,
) -> bytes:
    """``forwarded`` as JSON, its messages that are ``client_messages``' own objects as the
    client's bytes of them (``body``: the client's request, which ``client_messages`` were
    parsed from; ``spans``: where each of them is in it, if known). Raises
    jsonio.InvalidJSON as jsonio.dumps does."""
    messages = forwarded.get("messages")
    if not isinstance(messages, list) or not isinstance(client_messages, list):
        return jsonio.dumps(forwarded)
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
