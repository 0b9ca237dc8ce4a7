"""Which headers cross the proxy, in each direction. Raw ASGI headers: lower-case bytes."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Sequence

RawHeaders = Sequence[tuple[bytes, bytes]]

OVERHEAD = "x-prefill-proxy-overhead-ms"
# On the response of a request that carried a new compaction event: its kind.
COMPACTION = b"x-prefill-proxy-compaction"

# RFC 9110 section 7.6.1: connection-specific fields are not forwarded. Host and length are
# set again for the new connection and body.
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
    }
)


def _drop_set(headers: RawHeaders) -> frozenset[bytes]:
    """Hop-by-hop names, plus any the Connection header lists."""
    listed = [value for name, value in headers if name.lower() == b"connection"]
    if not listed:
        return _HOP_BY_HOP
    extra = {token.strip().lower() for value in listed for token in value.split(b",")}
    return _HOP_BY_HOP | extra


def upstream_request(headers: RawHeaders, *, parsed_body: bool) -> list[tuple[bytes, bytes]]:
    """Client headers for the upstream. A body the proxy re-encodes is sent as plain JSON,
    and its reply asked for uncompressed, since the proxy reads it."""
    drop = _drop_set(headers)
    if parsed_body:
        drop = drop | {b"accept-encoding", b"content-encoding"}
    kept = [(name, value) for name, value in headers if name.lower() not in drop]
    if parsed_body:
        kept.append((b"accept-encoding", b"identity"))
    return kept


def client_response(
    headers: RawHeaders, overhead_ms: bytes, *, keep_length: bool
) -> list[tuple[bytes, bytes]]:
    """Upstream response headers for the client, plus the proxy's overhead header."""
    drop = _drop_set(headers)
    if keep_length:
        drop = drop - {b"content-length"}
    kept = [(name.lower(), value) for name, value in headers if name.lower() not in drop]
    kept.append((OVERHEAD.encode(), overhead_ms))
    return kept


def with_length(headers: Iterable[tuple[bytes, bytes]], length: int) -> list[tuple[bytes, bytes]]:
    kept = [(name, value) for name, value in headers if name != b"content-length"]
    kept.append((b"content-length", str(length).encode()))
    return kept


def is_event_stream(headers: RawHeaders) -> bool:
    return any(
        name.lower() == b"content-type" and value.lower().startswith(b"text/event-stream")
        for name, value in headers
    )


# What authenticates a client to the engine (vLLM's --api-key reads Authorization; hosted
# OpenAI-compatible servers also use these). Reused for requests the proxy makes for that
# client (warm-ups, summaries) while its request lasts; never stored or logged.
_CREDENTIALS = frozenset({b"authorization", b"api-key", b"x-api-key"})


def credentials(headers: RawHeaders) -> tuple[tuple[bytes, bytes], ...]:
    return tuple((low, value) for name, value in headers if (low := name.lower()) in _CREDENTIALS)


def header_value(text: str) -> bytes:
    """``text`` as a header value: as it is when it is printable ASCII, else its hash."""
    if text.isascii() and text.isprintable():
        return text.encode("ascii")
    return b"x:" + hashlib.blake2b(text.encode(), digest_size=16).hexdigest().encode()


def upstream_credentials(key: str) -> tuple[tuple[bytes, bytes], ...]:
    """The upstream's own key as the credentials to send; none for an empty key."""
    return ((b"authorization", b"Bearer " + key.encode("latin-1")),) if key else ()


def with_upstream_key(headers: list[tuple[bytes, bytes]], key: str) -> list[tuple[bytes, bytes]]:
    """``headers`` with the client's credentials replaced by the upstream's own key."""
    kept = [(name, value) for name, value in headers if name.lower() not in _CREDENTIALS]
    kept.extend(upstream_credentials(key))
    return kept


def key_allowed(headers: RawHeaders, keys: Sequence[bytes]) -> bool:
    """Whether the request's ``Authorization: Bearer KEY`` is one of ``keys``: every key is
    compared, in constant time, so the answer's timing says nothing of them."""
    sent = next((value for name, value in headers if name.lower() == b"authorization"), b"")
    token = sent[7:] if sent[:7].lower() == b"bearer " else b""
    found = False
    for key in keys:
        found |= hmac.compare_digest(token, key)
    return found
