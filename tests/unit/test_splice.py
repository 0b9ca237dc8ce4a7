"""The spliced encode (proxy.splice) is a shortcut, not another answer: what it forwards
parses to exactly what the whole encode gives, whatever the client's JSON looks like, and
the messages passed on untouched go as the client's own bytes."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import jsonio, splice
from tests.support.conversations import conversations

# How clients write JSON: compact, Python's default spacing, indented, ASCII escapes.
STYLES = (
    {"separators": (",", ":"), "ensure_ascii": False},
    {},
    {"indent": 2},
    {"indent": "\t", "ensure_ascii": True},
    {"separators": (" , ", " : ")},
)


def body_of(request: dict[str, Any], style: dict[str, Any]) -> bytes:
    return json.dumps(request, **style).encode()


def same(left: bytes, right: bytes) -> bool:
    """Equal as JSON, types included (Python's == has True == 1)."""
    return jsonio.dumps_canonical(jsonio.loads(left)) == jsonio.dumps_canonical(jsonio.loads(right))


def forwarded_from(client: dict[str, Any], changed: set[int]) -> dict[str, Any]:
    """What a rewrite makes of ``client``: some messages replaced, a field added."""
    messages = [
        {**message, "content": "rewritten"} if index in changed else message
        for index, message in enumerate(client["messages"])
    ]
    return {**client, "messages": messages, "stream_options": {"include_usage": True}}


@settings(max_examples=200, deadline=None)
@given(
    conversations(),
    st.sampled_from(STYLES),
    st.sets(st.integers(min_value=0, max_value=12)),
    st.booleans(),
)
def test_spliced_requests_parse_as_the_whole_encode(
    messages: list[Any], style: dict[str, Any], changed: set[int], padded: bool
) -> None:
    request = {"model": "m", "messages": messages, "tools": [{"type": "function"}]}
    if padded:  # over the size from which the proxy splices
        request["metadata"] = {"pad": "x" * splice.MIN_BYTES}
    body = body_of(request, style)
    client = jsonio.loads(body)
    forwarded = forwarded_from(client, changed)
    spliced = splice.encode(forwarded, client["messages"], body)
    assert same(spliced, jsonio.dumps(forwarded))


def test_untouched_messages_go_as_the_clients_bytes() -> None:
    history = [{"role": "tool", "tool_call_id": f"c{n}", "content": "é" * 2000} for n in range(20)]
    request = {"model": "m", "messages": [{"role": "system", "content": "s"}, *history]}
    body = body_of(request, {"indent": 1, "ensure_ascii": True})
    client = jsonio.loads(body)
    forwarded = forwarded_from(client, {0})
    spliced = splice.encode(forwarded, client["messages"], body)
    assert same(spliced, jsonio.dumps(forwarded))
    untouched = json.dumps(history[5], indent=1, ensure_ascii=True).replace("\n", "\n  ")
    assert untouched.encode() in spliced  # the client's spacing and escapes, as sent
    assert b'"content":"rewritten"' in spliced  # the changed one encoded afresh
    assert "é".encode() not in spliced


def test_whatever_the_scan_cannot_read_is_encoded_whole() -> None:
    pad = "x" * splice.MIN_BYTES
    bodies = [
        # NaN: Python's json (so jsonio) reads it, msgspec does not
        b'{"messages":[{"role":"user","content":"%s","n":NaN}]}' % pad.encode(),
        b'{"messages":{"role":"user"},"pad":"%s"}' % pad.encode(),  # not a list
    ]
    for body in bodies:
        client = jsonio.loads(body)
        forwarded = {**client, "added": 1}
        assert splice.encode(forwarded, client["messages"], body) == jsonio.dumps(forwarded)


def test_messages_that_are_not_the_clients_objects_are_encoded() -> None:
    """Equal but another object (a restored reply equal to what the client sent): encoded,
    not looked up by value."""
    request = {"model": "m", "messages": [{"role": "user", "content": "y" * splice.MIN_BYTES}]}
    body = body_of(request, {"indent": 4})
    client = jsonio.loads(body)
    forwarded = {**client, "messages": [dict(client["messages"][0])]}
    assert splice.encode(forwarded, client["messages"], body) == jsonio.dumps(forwarded)
