"""The fast scans over a history (proxy.scans, proxy.transcript.matched_messages, and the
scans carried from a request to the next) give what a plain Python loop over the
messages gives, whatever the messages hold."""

from __future__ import annotations

import itertools
import operator
import platform
import sys
from collections.abc import Iterator
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy import scans
from proxy.batching import steps_in_turn
from proxy.history import head_key
from proxy.known import Known
from proxy.rewrite import volatile
from proxy.rewrite.detector import DEFAULT_DETECTOR
from proxy.rewrite.learned import SOURCE_ROLES
from proxy.rewrite.volatile import _all_in
from proxy.scans import replaced, with_role
from proxy.sessions import Session
from proxy.transcript import chain_keys, exact_chain, matched_messages
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
@example([{"role": r} for r in ("user", "assistant", "user", "tool", "assistant", "tool")])
def test_steps_in_turn_counts_assistants_after_the_last_user(messages: list[Any]) -> None:
    steps = 1
    for item in reversed(messages):
        if role_of(item) == "user":
            break
        if role_of(item) == "assistant":
            steps += 1
    assert steps_in_turn(messages) == steps
    # with the scans of a request it continues (the same objects, fewer of them)
    known = Known().continued(messages[: len(messages) // 2])
    steps_in_turn(messages[: len(messages) // 2], known)
    assert steps_in_turn(messages, known.continued(messages)) == steps


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


def test_a_note_carrier_is_looked_for_where_it_was_found_and_checked_there() -> None:
    """volatile._all_in takes a carrier's last place only where the key is still there: a
    place out of range, or holding another key, is searched past as without it."""
    keys = [b"a", b"b", b"c", b"d"]
    volatile._FOUND_AT[b"c"] = 3  # holds b"d"
    assert _all_in([b"b", b"c"], keys, 4)
    assert volatile._FOUND_AT[b"c"] == 2
    assert not _all_in([b"c"], keys, 2)  # found at 2, but only keys[:2] count
    volatile._FOUND_AT[b"x"] = 0
    assert not _all_in([b"x"], keys, 4)
    volatile._FOUND_AT[b"d"] = 3
    assert not _all_in([b"d"], keys[:2], 5)  # a place past the end of a shorter history


def _walked(now: list[Any], before: list[Any]) -> list[int]:
    """What ``replaced`` finds, object by object."""
    return list(itertools.compress(itertools.count(), map(operator.is_not, now, before)))


# Where a list holds another object than the one before: the same, a copy (equal, so only
# identity tells), a new one; runs of each, so blocks hold none, some or all replaced.
runs = st.lists(st.tuples(st.sampled_from(["same", "copy", "new"]), st.integers(1, 9)), max_size=12)


@settings(max_examples=300)
@given(runs, st.integers(-6, 6), st.integers(1, 5))
def test_replaced_by_block_is_the_walk_over_every_object(
    pattern: list[tuple[str, int]], longer_by: int, block: int
) -> None:
    """Lists compared a block of addresses at a time find the very indices a walk over
    every pair finds, in order: whatever the block size, runs of replaced objects, and
    either list the longer."""
    kinds = [kind for kind, length in pattern for _ in range(length)]
    before = [{"i": i} for i in range(len(kinds))]
    made = {"same": lambda item: item, "copy": dict, "new": lambda item: {"new": item["i"]}}
    now = [made[kind](item) for kind, item in zip(kinds, before, strict=True)]
    if longer_by > 0:
        now += [{"extra": i} for i in range(longer_by)]
    else:
        del before[len(before) + longer_by :]
    assert list(scans._replaced_by_block(now, before, block)) == _walked(now, before)
    # and through ``replaced``, where the lists are long enough for blocks
    assert list(replaced(now * 40, before * 40)) == _walked(now * 40, before * 40)


@given(runs, st.integers(-6, 6), st.integers(0, 60), st.integers(0, 80))
@example([("same", 9)], 3, 0, 9)  # from the start to the shorter one's end: no slices
@example([("same", 4), ("new", 1)], -2, 0, 80)
def test_same_run_counts_the_very_objects_from_start_to_stop(
    pattern: list[tuple[str, int]], longer_by: int, start: int, stop: int
) -> None:
    """scans.same_run: the leading objects of ``now[start:stop]`` that are ``before``'s at
    the same places, whether or not it compares the lists without slicing them."""
    kinds = [kind for kind, length in pattern for _ in range(length)]
    before = [{"i": i} for i in range(len(kinds))]
    now = [item if kind == "same" else dict(item) for kind, item in zip(kinds, before, strict=True)]
    if longer_by > 0:
        now += [{"extra": i} for i in range(longer_by)]
    else:
        del before[len(before) + longer_by :]
    shorter = min(len(now), len(before))
    start = min(start, shorter)  # as Memo.chain asks: start <= stop <= the shorter's end
    stop = max(start, min(stop, shorter))
    same = 0
    for index in range(start, stop):
        if now[index] is not before[index]:
            break
        same += 1
    assert scans.same_run(now, before, start, stop) == same


def test_lists_are_compared_by_address_on_cpython() -> None:
    """The block comparison is in use where the interpreter is CPython (else ``replaced``
    walks every pair, as it did): its addresses are ``id``'s."""
    if platform.python_implementation() == "CPython":
        assert scans._ADDRESSES_READABLE
        items = [object() for _ in range(5)]
        assert scans._addresses(items, 5) == b"".join(
            id(item).to_bytes(scans._WORD, sys.byteorder) for item in items
        )


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
    Known.continued as a continued body's is, with the lead the body cache knows) finds what
    a scan of the whole list finds, whatever changed between the two lists: the same
    objects, fewer, other ones, copies."""
    known, messages = Known(), []
    for edit, at, new, roles in steps:
        previous, messages = messages, _next_list(messages, edit, at, new)
        # as the body cache says it: the previous array, and how many of its objects lead
        known = known.continued(
            messages, (), (previous, scans.same_run(messages, previous, 0, len(messages)))
        )
        assert list(with_role(messages, roles, known, "client")) == with_role(messages, roles)
        # a second pass over the same list in the same request finds it all again
        assert list(with_role(messages, roles, known, "client")) == with_role(messages, roles)
        # another pass over the same list, for other roles, and one over another list by
        # its own name in between
        tail = messages[at % (len(messages) + 1) :]
        assert list(with_role(tail, roles, known, "tail")) == with_role(tail, roles)
        assert list(with_role(messages, USER, known, "client")) == with_role(messages, USER)


def test_a_scan_carried_on_looks_only_at_the_new_messages() -> None:
    """The saving itself: the messages the scans before covered are not read again, for any
    of the roles they were looked for. Shown by changing one of them in place, which the
    proxy never does to a parsed message (the next request shares it): a carried scan
    does not see the change, a full one would."""
    users = frozenset({"user"})
    system, user = {"role": "system", "content": "s"}, {"role": "user", "content": "u"}
    systems = frozenset({"system"})
    known = Known().continued([system, user])
    assert list(with_role([system, user], users, known, "client")) == [1]
    assert list(with_role([system, user], systems, known, "client")) == [0]
    system["role"] = "user"
    messages = [system, user, {"role": "user", "content": "new"}]
    known = known.continued(messages)
    assert list(with_role(messages, users, known, "client")) == [1, 2]
    assert with_role(messages, users) == [0, 1, 2]
    # the list's scan for other roles was carried on with it too
    assert list(with_role(messages, systems, known, "client")) == [0]
    assert with_role(messages, systems) == []


def test_a_list_changed_after_its_scan_is_scanned_again_unless_it_is_the_parsed_array() -> None:
    """A scan keeps a copy of a list that is not the body's parsed array (a rewrite's list
    may change after it), so the changed list is looked at again; the parsed array, which
    the body cache shares and nothing changes, is kept as it is."""
    users = frozenset({"user"})
    array = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    known = Known().continued(array)
    rewritten = list(array)
    assert list(with_role(rewritten, users, known, "rewritten")) == [1]
    rewritten[0] = {"role": "user", "content": "moved here"}
    assert list(with_role(rewritten, users, known, "rewritten")) == [0, 1]
    assert list(with_role(array, users, known, "client")) == [1]
    assert known.scans["client"][0] is array


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


@given(st.lists(st.booleans(), max_size=40), st.integers(-1, 42), st.booleans())
def test_a_turn_says_whether_more_than_some_messages_were_replaced(
    replaced_at: list[bool], count: int, listed_first: bool
) -> None:
    """Turn.replaced_more_than: what the length of replaced_in says, whether or not that
    was worked out for the list before (a scan that stops early otherwise)."""
    client = [{"role": "user", "content": str(index)} for index in range(len(replaced_at))]
    rewritten = [dict(m) if swap else m for m, swap in zip(client, replaced_at, strict=True)]
    turn = Turn(Session("s"), client, [b"k"] * len(client))
    if listed_first:
        turn.replaced_in(rewritten)
    assert turn.replaced_more_than(rewritten, count) == (sum(replaced_at) > count)
    # whatever it kept for replaced_in is replaced_in's whole answer
    assert turn.replaced_in(rewritten) == [i for i, swap in enumerate(replaced_at) if swap]


well_formed = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(ROLES), "content": st.text(max_size=3)}),
    st.text(max_size=3),  # not an object: never the system prompt
)


@given(st.lists(well_formed, max_size=12))
@example([{"role": "system"}, {"role": "user"}, {"role": "developer"}, {"role": "assistant"}])
def test_head_key_is_the_key_of_the_first_two_messages_after_the_system_prompt(
    messages: list[Any],
) -> None:
    mask = DEFAULT_DETECTOR.key
    body = [m for m in messages if not isinstance(m, dict) or m.get("role") not in SOURCE_ROLES]
    expected = chain_keys(body[:2], mask)[-1] if len(body) >= 2 else None
    assert head_key(messages, mask) == expected

    def history_that_must_not_be_read_past_the_first_exchange() -> Iterator[Any]:
        yield from messages
        raise AssertionError("read past the first exchange")

    if expected is not None:  # a new session's first request may bring thousands
        assert head_key(history_that_must_not_be_read_past_the_first_exchange(), mask) == expected
