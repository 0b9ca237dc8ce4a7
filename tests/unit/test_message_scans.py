"""The fast scans over a history (proxy.scans, proxy.transcript.matched_messages, and the
scans carried from a request to the next) give what a plain Python loop over the
messages gives, whatever the messages hold."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy.batching import steps_in_turn
from proxy.rewrite.pipeline import RewriteContext
from proxy.rewrite.restore import restore_history
from proxy.rewrite.volatile import _all_in
from proxy.scans import with_role
from proxy.sessions import Session
from proxy.transcript import Known, chain_keys, exact_chain, matched_messages
from proxy.turn import Turn

ROLES = ["system", "developer", "user", "assistant", "tool", "other"]
role_values = st.one_of(
    st.sampled_from(ROLES), st.none(), st.integers(), st.lists(st.text(max_size=3), max_size=2)
)
message = st.one_of(
    st.fixed_dictionaries({"role": role_values, "content": st.text(max_size=3)}),
    st.fixed_dictionaries({"content": st.text(max_size=3)}),  # no role
    st.text(max_size=3),  # not an object
    st.none(),
)
role_sets = st.frozensets(st.sampled_from(ROLES), max_size=3)


def role_of(item: Any) -> Any:
    return item.get("role") if isinstance(item, dict) else None


@given(st.lists(message, max_size=30), role_sets)
def test_with_role_is_the_loop_it_replaces(messages: list[Any], roles: frozenset[str]) -> None:
    expected = [
        i for i, m in enumerate(messages) if isinstance(role_of(m), str) and role_of(m) in roles
    ]
    assert with_role(messages, roles) == expected


@given(st.lists(st.fixed_dictionaries({"role": st.sampled_from(ROLES)}), max_size=30), role_sets)
def test_with_role_on_well_formed_messages(messages: list[Any], roles: frozenset[str]) -> None:
    assert with_role(messages, roles) == [i for i, m in enumerate(messages) if m["role"] in roles]


@given(st.lists(message, max_size=30))
def test_steps_in_turn_counts_assistants_after_the_last_user(messages: list[Any]) -> None:
    steps = 1
    for item in reversed(messages):
        if role_of(item) == "user":
            break
        if role_of(item) == "assistant":
            steps += 1
    assert steps_in_turn(messages) == steps


values = st.lists(st.integers(0, 3), max_size=12)


@given(values, values, values)
def test_matched_messages_is_the_common_prefix(
    shared: list[int], tail: list[int], other_tail: list[int]
) -> None:
    """Over chains (exact_chain: link i covers messages 0..i), whether one extends the
    other, they part after a common start, or one is a prefix of the other."""
    chain, before = exact_chain([*shared, *tail]), exact_chain([*shared, *other_tail])
    matched = 0
    for now, then in zip(chain, before, strict=False):
        if now != then:
            break
        matched += 1
    assert matched_messages(chain, before) == matched
    assert matched_messages(chain, tuple(before)) == matched  # a session keeps a tuple


@given(
    st.lists(st.binary(min_size=1, max_size=1), max_size=5),
    st.lists(st.binary(min_size=1, max_size=1), max_size=12),
    st.integers(0, 14),
)
def test_note_carriers_are_found_in_the_history_in_any_order(
    carriers: list[bytes], keys: list[bytes], stop: int
) -> None:
    """volatile._all_in (carriers looked for in order, a set where they are not) is the
    plain membership test, in order or not, repeated or missing."""
    assert _all_in(carriers, keys, stop) == all(c in keys[:stop] for c in carriers)


# How a request's list is made from the one before: kept as it was, trimmed, with one
# message replaced (by a copy, equal or not) or with every message a copy; then new ones.
edits = st.sampled_from(["same", "trim", "replace", "equal copy", "copies"])


def _next_list(before: list[Any], edit: str, at: int, new: list[Any]) -> list[Any]:
    messages = list(before)
    if messages and edit == "trim":
        del messages[at % len(messages) :]
    elif messages and edit == "replace":
        messages[at % len(messages)] = {"role": ROLES[at % len(ROLES)], "content": "replaced"}
    elif messages and edit == "equal copy":
        index = at % len(messages)
        item = messages[index]
        messages[index] = dict(item) if isinstance(item, dict) else item
    elif edit == "copies":
        messages = [dict(m) if isinstance(m, dict) else m for m in messages]
    elif messages and edit == "reformed":  # a field chain keys leave out: the same key
        index = at % len(messages)
        item = messages[index]
        messages[index] = {**item, "refusal": None} if isinstance(item, dict) else item
    return messages + new


TOOL, USER = {"role": "tool", "content": "t"}, frozenset({"user"})


@settings(max_examples=400)
@given(
    st.lists(
        st.tuples(edits, st.integers(0, 40), st.lists(message, max_size=6), role_sets),
        max_size=8,
    )
)
@example([("same", 0, [TOOL] * 4, USER), ("replace", 2, [], USER)])  # a middle one
def test_scans_carried_from_request_to_request_are_the_full_scans(
    steps: list[tuple[str, int, list[Any], frozenset[str]]],
) -> None:
    """A request's scan that reuses the one before it (Known.with_role, carried on by
    Known.continued as a continued body's is) finds what a scan of the whole list finds,
    whatever changed between the two lists: the same objects, fewer, other ones, copies."""
    known, messages = Known(), []
    for edit, at, new, roles in steps:
        messages = _next_list(messages, edit, at, new)
        known = known.continued(messages)
        assert list(with_role(messages, roles, known, "client")) == with_role(messages, roles)
        # a second pass over the same list in the same request finds it all again
        assert list(with_role(messages, roles, known, "client")) == with_role(messages, roles)


def test_a_scan_carried_on_looks_only_at_the_new_messages() -> None:
    """The saving itself: the messages the scan before covered are not read again. Shown by
    changing one of them in place, which the proxy never does to a parsed message (the
    next request shares it): a carried scan does not see the change, a full one would."""
    users = frozenset({"user"})
    system, user = {"role": "system", "content": "s"}, {"role": "user", "content": "u"}
    known = Known().continued([system, user])
    assert list(with_role([system, user], users, known, "client")) == [1]
    system["role"] = "user"
    messages = [system, user, {"role": "user", "content": "new"}]
    known = known.continued(messages)
    assert list(with_role(messages, users, known, "client")) == [1, 2]
    assert with_role(messages, users) == [0, 1, 2]


# What the session's record does to a message's recorded form between two requests.
records = st.sampled_from(["keep", "equal copy", "other", "the client's", "drop"])
chat_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool"]), "content": st.text(max_size=2)}
)


def _record(substitutions: dict[bytes, Any], key: bytes, given: Any, what: str) -> None:
    if what == "equal copy" and key in substitutions:
        substitutions[key] = dict(substitutions[key])
    elif what == "other":
        substitutions[key] = {"role": "assistant", "content": "as emitted"}
    elif what == "the client's":
        substitutions[key] = dict(given)
    elif what == "drop":
        substitutions.pop(key, None)


@settings(max_examples=400)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["same", "trim", "replace", "equal copy", "copies", "reformed"]),
            st.integers(0, 40),
            st.lists(chat_message, max_size=6),
            st.lists(st.tuples(st.integers(0, 40), records), max_size=6),
        ),
        max_size=8,
    )
)
@example(  # recorded as the client sent them, then the middle one changed in form only
    [
        (
            "same",
            0,
            [{"role": r, "content": ""} for r in ["user", "assistant", "tool"] * 2],
            [(0, "the client's"), (1, "the client's"), (2, "the client's")],
        ),
        ("reformed", 1, [], []),
    ]
)
def test_restoration_carried_from_request_to_request_is_the_full_restoration(
    steps: list[tuple[str, int, list[Any], list[tuple[int, str]]]],
) -> None:
    """restore_history with the comparisons of the request before (Known.restored) gives
    the very messages it gives comparing all anew, whatever changed between the two
    requests: the client's list (kept, trimmed, one replaced, copied or changed in form
    only, all copies) and
    the recorded forms (kept, copied, replaced, the client's own, dropped)."""
    known, messages, substitutions = Known(), [], {}
    for edit, at, new, recorded in steps:
        messages = _next_list(messages, edit, at, new)
        keys = chain_keys(messages)
        substitutions = dict(substitutions)  # as a store copies a record
        for index, what in recorded if messages else ():
            index %= len(messages)
            _record(substitutions, keys[index], messages[index], what)
        session = Session("s", substitutions=substitutions)
        request = {"messages": messages}
        known = known.continued(messages)
        carried = restore_history(
            request, RewriteContext(session=session, message_keys=keys, known=known)
        )
        full = restore_history(request, RewriteContext(session=session, message_keys=keys))
        if full is None:
            assert carried is None
            continue
        assert carried is not None
        assert len(carried["messages"]) == len(full["messages"])
        assert all(a is b for a, b in zip(carried["messages"], full["messages"], strict=True))


def test_restoration_carried_on_compares_only_the_new_messages() -> None:
    """The saving itself: a recorded form compared with the client's message before is not
    compared again. Shown by changing the record in place, which the proxy never does: the
    carried comparison does not see it, a full one would."""
    reply = {"role": "assistant", "content": "done"}
    messages = [{"role": "user", "content": "go"}, reply, {"role": "user", "content": "ok"}]
    keys = chain_keys(messages)
    recorded = dict(reply)
    session = Session("s", substitutions={keys[1]: recorded})
    known = Known().continued(messages)
    context = RewriteContext(session=session, message_keys=keys, known=known)
    assert restore_history({"messages": messages}, context) is None
    recorded["content"] = "done, as emitted"
    messages = [*messages, {"role": "user", "content": "more"}]
    keys = chain_keys(messages)
    known = known.continued(messages)
    context = RewriteContext(session=session, message_keys=keys, known=known)
    assert restore_history({"messages": messages}, context) is None
    full = restore_history(
        {"messages": messages}, RewriteContext(session=session, message_keys=keys)
    )
    assert full is not None and full["messages"][1] is recorded


def test_a_turn_finds_the_replaced_messages_of_a_list_once() -> None:
    """Turn.replaced_in: the splice, the compaction bound and the record ask for the same
    list; another list (equal values, other objects) is looked at afresh."""
    client = [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]
    turn = Turn(Session("s"), client, [b"1", b"2"])
    rewritten = [client[0], {"role": "tool", "content": "b, noted"}]
    assert turn.replaced_in(rewritten) == [1]
    assert turn.replaced_in(rewritten) is turn.replaced_in(rewritten)
    assert turn.replaced_in([dict(client[0]), client[1]]) == [0]
    assert turn.replaced_in(client) == []
