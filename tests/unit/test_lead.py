"""What a conversation's next request is sent early with (proxy.pieces.Lead) and the check
that the request built then does begin with it (``after``): the check never passes a
request that differs, and passes the next step of a history the proxy kept byte-stable,
whatever the client's JSON looks like and whichever way the request was encoded."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import bodies, jsonio, splice
from proxy.pieces import Body, Lead, Pieces, after, joined
from tests.support.conversations import conversations
from tests.unit.test_splice import STYLES, body_of, forwarded_from

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {}}}]


def step(
    messages: list[Any], style: dict[str, Any], changed: set[int], dropped: frozenset[int]
) -> tuple[bytes, Body, int]:
    """(the client's body, what the proxy forwards of it, where its messages end)."""
    request = {"model": "m", "tools": TOOLS, "messages": messages}
    body = body_of(request, style)
    client = jsonio.loads(body)
    found = bodies.message_spans(body)
    spans = None if found is None else found[1]
    forwarded = forwarded_from(client, changed, dropped) if changed or dropped else client
    if forwarded is client:
        forwarded = {**client, "parallel_tool_calls": True}  # only a field added
    content = splice.encode_pieces(forwarded, client["messages"], body, spans, client)
    return body, content, spans[-1][1] if spans else len(body)


def check(lead: Lead, content: Body, body: bytes) -> Body | None:
    """``after``, held to what it promises against the joined bytes."""
    rest = after(content, body, lead)
    expected = bytes(lead.rebuilt(body))
    if rest is None:
        assert not joined(content).startswith(expected)
    else:
        assert expected + joined(rest) == joined(content)
    return rest


@settings(max_examples=300, deadline=None)
@given(
    conversations(),
    conversations(),
    st.sampled_from(STYLES),
    st.sets(st.integers(min_value=0, max_value=12)),
    st.sets(st.integers(min_value=0, max_value=12)),
    st.frozensets(st.integers(min_value=0, max_value=12)),
)
def test_the_next_request_is_passed_only_where_it_begins_with_the_lead(
    history: list[Any],
    more: list[Any],
    style: dict[str, Any],
    changed: set[int],
    changed_next: set[int],
    dropped: frozenset[int],
) -> None:
    """The next step appends ``more``; its rewrites change the same messages (a stable
    history: passed) or others (checked against the bytes either way)."""
    if not history:
        return
    body, content, kept = step(history, style, changed, dropped)
    lead = Lead.of(content, body, kept)
    if lead is None:
        return
    assert joined(content).startswith(bytes(lead.rebuilt(body)))
    same = step([*history, *more], style, changed, dropped)
    next_body = same[0]
    assert next_body.startswith(body[:kept])
    # Rewritten and left out where the history is: the new messages untouched, so the
    # body is encoded the same way (a rewrite of a new one, a restored reply, takes a
    # request passed on as the client's bytes to an encode of its head: not its lead).
    if more and all(index < len(history) for index in changed | dropped):
        assert check(lead, same[1], next_body) is not None
    other = step([*history, *more], style, changed_next, dropped)
    check(lead, other[1], other[0])


def test_a_history_rewritten_in_the_middle_is_found_out() -> None:
    history = [{"role": "system", "content": "s"}] + [
        {"role": "tool", "tool_call_id": f"c{n}", "content": "x" * 3000} for n in range(60)
    ]
    more = [{"role": "user", "content": "next " + "y" * 4000}]  # longer than one before
    body, content, kept = step(history, {}, {0}, frozenset())
    assert isinstance(content, Pieces) and content.history_end > 0
    lead = Lead.of(content, body, kept)
    assert lead is not None and len(lead) == content.history_end
    # The same rewrite: every client part found at its own place, nothing compared.
    next_body, next_content, _ = step([*history, *more], {}, {0}, frozenset())
    rest = check(lead, next_content, next_body)
    assert rest is not None and joined(rest).startswith(b', {"role": "user"')
    # Another message rewritten in the middle, the system prompt not, or a message left
    # out (the client's bytes from another place, as long): not the lead.
    for changed, dropped in (({0, 30}, set()), (set(), set()), ({0}, {1})):
        other_body, other_content, _ = step([*history, *more], {}, changed, frozenset(dropped))
        assert check(lead, other_content, other_body) is None
    # A message left out without a summary in its place: the client's bytes that follow
    # are where the lead's were, but cut from further on.
    client = jsonio.loads(next_body)
    messages = client["messages"]
    shifted = {**client, "messages": [{**messages[0], "content": "rewritten"}, *messages[2:]]}
    spans = bodies.message_spans(next_body)[1]  # type: ignore[index]
    shifted_content = splice.encode_pieces(shifted, messages, next_body, spans, client)
    assert check(lead, shifted_content, next_body) is None
    # The client's body passed on as it is: its own bytes lead.
    untouched = Lead.of(body, body, kept)
    assert untouched is not None and untouched.parts == ((0, kept),)
    assert check(untouched, next_body, next_body) is not None
    assert check(untouched, next_content, next_body) is None
