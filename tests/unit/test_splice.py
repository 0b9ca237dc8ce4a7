"""The spliced encode (proxy.splice) is a shortcut, not another answer: what it forwards
parses to exactly what the whole encode gives, whatever the client's JSON looks like, and
the messages passed on untouched go as the client's own bytes."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy import bodies, jsonio, splice
from proxy.pieces import Pieces
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


def forwarded_from(
    client: dict[str, Any], changed: set[int], dropped: frozenset[int] = frozenset()
) -> dict[str, Any]:
    """What a rewrite makes of ``client``: some messages replaced, a field added; and what
    compaction makes of it: some left out, a summary in the first one's place."""
    messages = [
        {**message, "content": "rewritten"} if index in changed else message
        for index, message in enumerate(client["messages"])
        if index not in dropped
    ]
    if dropped:
        messages.insert(min(dropped, default=0), {"role": "user", "content": "summary"})
    return {**client, "messages": messages, "stream_options": {"include_usage": True}}


@settings(max_examples=200, deadline=None)
@given(
    conversations(),
    st.sampled_from(STYLES),
    st.sets(st.integers(min_value=0, max_value=12)),
    st.booleans(),
    st.frozensets(st.integers(min_value=0, max_value=12)),
)
def test_spliced_requests_parse_as_the_whole_encode(
    messages: list[Any],
    style: dict[str, Any],
    changed: set[int],
    padded: bool,
    dropped: frozenset[int],
) -> None:
    request = {"model": "m", "messages": messages, "tools": [{"type": "function"}]}
    if padded:  # over the size from which the proxy splices
        request["metadata"] = {"pad": "x" * splice.MIN_BYTES}
    body = body_of(request, style)
    client = jsonio.loads(body)
    forwarded = forwarded_from(client, changed, dropped)
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


@settings(max_examples=200, deadline=None)
@given(
    conversations(),
    st.sampled_from(STYLES),
    st.dictionaries(
        st.sampled_from(["parallel_tool_calls", "stream_options", "model", "é", 'a"b']),
        st.one_of(st.booleans(), st.none(), st.just({"include_usage": True}), st.text()),
        max_size=3,
    ),
    st.booleans(),
)
def test_fields_added_to_the_clients_request_go_after_its_own_bytes(
    messages: list[Any], style: dict[str, Any], fields: dict[str, Any], copied: bool
) -> None:
    """Only top-level fields added (the messages the client's objects, in the client's
    list or a copy of it): the client's bytes, then the new fields, parsing as the whole
    encode. A field the client had, given another value: the encode path, same parse."""
    request = {"model": "m", "messages": messages}
    body = body_of(request, style) + b"\n"
    client = jsonio.loads(body)
    listed = list(client["messages"]) if copied else client["messages"]
    forwarded = {**client, "messages": listed, **fields}
    spliced = splice.encode(forwarded, client["messages"], body, client=client)
    assert same(spliced, jsonio.dumps(forwarded))
    new = {key for key in fields if key not in client}
    if "model" not in fields or fields["model"] is client["model"]:
        own = body.rstrip()[:-1]
        assert spliced.startswith(own) and (new or spliced == body)


def test_a_client_field_given_another_value_is_not_written_twice() -> None:
    body = b'{"model":"m","messages":[],"parallel_tool_calls":false}'
    client = jsonio.loads(body)
    forwarded = {**client, "parallel_tool_calls": True}
    spliced = splice.encode(forwarded, client["messages"], body, client=client)
    assert spliced.count(b"parallel_tool_calls") == 1
    assert jsonio.loads(spliced) == forwarded


@settings(max_examples=200, deadline=None)
@given(conversations(), st.sampled_from(STYLES), st.booleans())
@example([{"role": "user", "content": "messages"}], STYLES[0], False)  # the key twice
def test_other_fields_changed_around_the_clients_messages(
    messages: list[Any], style: dict[str, Any], copied: bool
) -> None:
    """The messages all the client's (its list or a copy), other fields changed (tools
    put in order, one dropped, one added): it parses as the whole encode, and where the
    spans are known the messages array is the client's bytes of it."""
    tools = [{"type": "function", "function": {"name": n}} for n in ("b", "a")]
    request = {"tools": tools, "model": "m", "messages": messages, "user": "u"}
    body = body_of(request, style)
    client = jsonio.loads(body)
    found = bodies.message_spans(body)
    # The key written once, the spans are known; written again (a message's text is
    # "messages") they cannot be told for sure, and the splice goes without them.
    assert (found is not None) == (body.count(b'"messages"') == 1)
    spans = None if found is None else found[1]
    listed = list(client["messages"]) if copied else client["messages"]
    forwarded = {"tools": tools[::-1], "model": "m", "messages": listed, "seed": 1}
    spliced = splice.encode(forwarded, client["messages"], body, spans, client)
    assert same(spliced, jsonio.dumps(forwarded))
    if spans:
        assert body[spans[0][0] : spans[-1][1]] in spliced
    assert list(jsonio.loads(spliced)) == list(forwarded)  # the forwarded field order


def test_the_history_goes_as_views_of_the_clients_body_not_copies() -> None:
    """On the request path the pieces are not joined: the untouched run of messages is a
    view into the client's body (its bytes are not copied), and the pieces join to what
    ``encode`` gives."""
    messages = [{"role": "user", "content": f"step {n} " + "x" * 2000} for n in range(40)]
    body = body_of({"model": "m", "messages": messages}, STYLES[1])
    found = bodies.message_spans(body)
    assert found is not None
    client = jsonio.loads(body)
    forwarded = forwarded_from(client, changed={39})
    wire = splice.encode_pieces(forwarded, client["messages"], body, found[1])
    assert isinstance(wire, Pieces)
    views = [part for part in wire.parts if isinstance(part, memoryview)]
    assert views and all(view.obj is body for view in views)
    assert sum(map(len, views)) > len(body) * 0.9
    assert bytes(wire) == splice.encode(forwarded, client["messages"], body, found[1])
