"""The per-session digest memo (proxy.transcript.Memo) is a shortcut, not another answer:
chain keys and exact chains are the same with it as without, and the whole session path
forwards byte-identical requests with memos on and off (issue 16's equivalence test)."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy import jsonio, transcript
from proxy.bodies import BodyCache
from proxy.known import STALE_HASHES, Known
from proxy.replay import traces
from proxy.replay.profiles import Prompt, mixed, varied_clocks
from proxy.rewrite.detector import DEFAULT_DETECTOR
from proxy.transcript import (
    FLAT_MIN,
    Memo,
    Memos,
    chain_keys,
    exact_chain,
    exact_digest,
    normal_digest,
    normal_form,
)
from tests.support.conversations import conversations
from tests.support.stores import CodecStore
from tests.unit.test_sessions import Proxy

MASK = DEFAULT_DETECTOR.key


@settings(max_examples=150, deadline=None)
@given(conversations(), st.integers(min_value=0, max_value=12))
def test_memo_gives_the_same_chains(messages: list[Any], cut: int) -> None:
    earlier = Memo()
    head = messages[:cut]
    assert chain_keys(head, MASK, earlier) == chain_keys(head, MASK)
    assert exact_chain(head, earlier) == exact_chain(head)
    again = copy.deepcopy(messages)  # new objects, as the next request's parse makes
    memo = Memo(earlier.kept())
    assert chain_keys(again, MASK, memo) == chain_keys(messages, MASK)
    assert exact_chain(again, memo) == exact_chain(messages)


@settings(max_examples=150, deadline=None)
@given(conversations(), st.integers(min_value=0, max_value=12))
def test_memo_with_the_previous_step_s_objects_gives_the_same_chains(
    messages: list[Any], cut: int
) -> None:
    # proxy.bodies hands the next step the earlier parse's objects and what was known.
    known = Known()
    head = messages[:cut]
    earlier = Memo(None, known)
    assert chain_keys(head, MASK, earlier) == chain_keys(head, MASK)
    assert exact_chain(head, earlier) == exact_chain(head)
    assert {id(m) for m in head} <= known.hashes.keys()
    again = [*head, *copy.deepcopy(messages[cut:])]  # the same objects, then new ones
    memo = Memo(earlier.kept(), known.continued(again))
    assert chain_keys(again, MASK, memo) == chain_keys(messages, MASK)
    assert exact_chain(again, memo) == exact_chain(messages)


OTHER_MASK = DEFAULT_DETECTOR.mask  # another key form of system text (numbers kept apart)


@st.composite
def sessions_of_steps(draw: st.DrawFn) -> list[tuple[list[Any], Any]]:
    """Steps of one conversation as the body cache hands them over: each the previous
    step's objects (some replaced by a copy or an edit, as a clock or a restored reply
    is), then new messages, or fewer of them (a client trimming its history); keyed with
    the session's mask or, when it learned a line, another."""
    messages = draw(conversations())
    texts = st.sampled_from(["clock 10:15", "clock 10:16", "x", ""])
    steps: list[tuple[list[Any], Any]] = []
    current: list[Any] = []
    for end in sorted(draw(st.lists(st.integers(0, len(messages)), min_size=1, max_size=5))):
        step = [*current, *copy.deepcopy(messages[len(current) : max(end, len(current))])]
        if current and draw(st.booleans()):
            step = current[: draw(st.integers(0, len(current) - 1))]
        for index in draw(st.lists(st.integers(0, max(len(step) - 1, 0)), max_size=2)):
            if index < len(step):
                changed = dict(step[index])
                if draw(st.booleans()) and isinstance(changed.get("content"), str):
                    changed["content"] = changed["content"] + draw(texts)
                step[index] = changed  # a new object, equal or not
        steps.append((step, draw(st.sampled_from([MASK, OTHER_MASK]))))
        current = step
    return steps


@settings(max_examples=200, deadline=None)
@given(sessions_of_steps())
def test_chains_carried_from_the_previous_step_are_the_chains(
    steps: list[tuple[list[Any], Any]],
) -> None:
    known, digests = Known(), None
    for messages, mask in steps:
        memo = Memo(digests, known)
        assert chain_keys(messages, mask, memo) == chain_keys(messages, mask)
        assert exact_chain(messages, memo) == exact_chain(messages)
        digests, known = memo.kept(), known.continued(messages)


@given(st.lists(st.binary(max_size=2048), max_size=4))
def test_a_hash_is_blake2b_of_16_bytes_whatever_was_hashed_before(values: list[bytes]) -> None:
    """transcript._hash copies a hasher set up once: the stored keys' format (BLAKE2b, 16
    bytes) holds for each value, hashed after any others."""
    for value in values:
        assert transcript._hash(value) == hashlib.blake2b(value, digest_size=16).digest()


@settings(max_examples=100, deadline=None)
@given(sessions_of_steps(), st.integers(1, 80))
def test_memos_hold_what_they_count_when_a_step_adds_to_the_digests_it_was_given(
    steps: list[tuple[list[Any], Any]], limit: int
) -> None:
    """Memos.keep: a step's digests may be its previous step's dict with its own added in
    place (Memo.kept); what the memos count as held stays what they hold, within the
    limit, with another session's kept between."""
    memos, known = Memos(limit), Known()
    for number, (messages, mask) in enumerate(steps):
        memo = Memo(memos.get("a"), known)
        assert chain_keys(messages, mask, memo) == chain_keys(messages, mask)
        assert exact_chain(messages, memo) == exact_chain(messages)
        memos.keep("a", memo)
        known = known.continued(messages)
        other = Memo(memos.get("b"))
        exact_chain(messages[: number + 1], other)
        memos.keep("b", other)
        held = memos._memos.values()
        assert memos._held == sum(map(len, held)) <= limit


def test_a_step_that_appends_takes_its_history_s_links_as_they_were() -> None:
    # The shortcut is taken (not only correct): the earlier links are not worked out again.
    system = {"role": "system", "content": "Today is 2026-12-03."}
    history = [system, *({"role": "user", "content": f"m{n}"} for n in range(20))]
    known = Known()
    first = Memo(None, known)
    chain_keys(history, MASK, first)
    appended = [*history, {"role": "user", "content": "new"}]
    worked_out: list[Any] = []

    def normal(message: Any) -> bytes:
        worked_out.append(message)
        return normal_digest(message, MASK)

    second = known.continued(appended)
    memo = Memo(first.kept(), second)
    keys = memo.chain("keys", appended, MASK, normal)
    assert keys == chain_keys(appended, MASK)
    assert worked_out == [appended[-1]]
    # The same objects under another mask are keyed afresh.
    memo = Memo(memo.kept(), second.continued(appended))
    assert memo.chain("keys", appended, OTHER_MASK, normal) == chain_keys(appended, OTHER_MASK)
    assert len(worked_out) == 1 + len(appended)


def test_two_requests_continuing_one_step_both_take_its_links() -> None:
    # Another conversation sharing a kept body (proxy.bodies) continues the same Known:
    # chaining one continuation leaves the other's links in place.
    history = [{"role": "user", "content": f"m{n}"} for n in range(8)]
    known = Known()
    first = Memo(None, known)
    exact_chain(history, first)
    one, other = known.continued(history), known.continued(history)
    exact_chain(history, Memo(first.kept(), one))
    worked_out: list[Any] = []

    def exact(message: Any) -> bytes:
        worked_out.append(message)
        return exact_digest(message)

    assert Memo(first.kept(), other).chain("exact", history, None, exact) == exact_chain(history)
    assert worked_out == []


def test_a_conversation_that_shares_a_kept_body_takes_its_digests_with_its_objects() -> None:
    """A new conversation whose first request shares a kept body's messages as the very
    objects (proxy.bodies: another first user message, the same history after it) takes
    their digests with them, though its own memo is empty and every link after its first
    message is new. Shown by changing a message in place after the first conversation
    hashed it (which the proxy never does to a parsed message): the second conversation's
    keys are those of the message as it was, fresh keys are not."""
    history = [{"role": "user", "content": "task 1"}]
    history += [{"role": "tool", "content": f"result {n} " * 200} for n in range(6)]
    known = Known()
    first = Memo(None, known)
    chain_keys(history, MASK, first)
    exact_chain(history, first)
    as_it_was = copy.deepcopy(history)
    forked = [{"role": "user", "content": "task 2"}, *history[1:]]
    as_it_was[0] = forked[0]
    history[3]["content"] = "changed in place"
    other = Memo(None, known.continued(forked))
    assert chain_keys(forked, MASK, other) == chain_keys(as_it_was, MASK)
    assert exact_chain(forked, other) == exact_chain(as_it_was)
    assert chain_keys(forked, MASK) != chain_keys(as_it_was, MASK)
    # the objects it did not share are hashed as they are
    assert chain_keys(forked, MASK, Memo(None, Known())) == chain_keys(forked, MASK)


def test_hashes_of_objects_a_conversation_no_longer_holds_are_dropped() -> None:
    # Every step replaces its system prompt (a rewritten copy, a moved clock) and appends a
    # message: the replaced prompts' hashes (and so the prompts) are not kept for ever.
    history: list[Any] = [{"role": "user", "content": "go"}]
    known = Known()
    for step in range(200):
        system = {"role": "system", "content": f"step {step}"}
        messages = [system, *history]
        memo = Memo(None, known)
        exact_chain(messages, memo)
        assert len(known.hashes) <= len(messages) + STALE_HASHES + 1
        known = known.continued(messages)
        history.append({"role": "user", "content": f"m{step}"})


def test_values_equal_in_python_but_not_in_json_are_told_apart() -> None:
    forms = [{"role": "tool", "content": value} for value in (1, True, 1.0, "1", None, 0, False)]
    memo = Memo()
    assert [exact_chain([m], memo) for m in forms] == [exact_chain([m]) for m in forms]
    assert len({exact_chain([m], memo)[0] for m in forms}) == len(forms)
    reordered = {"content": "x", "role": "user"}
    assert exact_chain([reordered], memo) == exact_chain([{"role": "user", "content": "x"}])


def replay(memo_limit: int, profile: Any, conversations: list[traces.Conversation]) -> list:
    proxy = Proxy(CodecStore(), memo_limit=memo_limit)
    out = []
    for conversation in conversations:
        for index, step in enumerate(traces.steps(conversation)):
            prompt = profile(Prompt(step.messages, conversation.tools), conversation.id, index)
            forwarded, reason = proxy.step(prompt.messages, step.reply)
            out.append((jsonio.dumps_canonical(forwarded), reason))
    return out


@settings(max_examples=100, deadline=None)
@given(sessions_of_steps())
def test_chains_over_bodies_the_body_cache_continued_are_the_chains(
    steps: list[tuple[list[Any], Any]],
) -> None:
    """As the proxy runs it: each step's body parsed by the body cache (appended to, one
    message changed, trimmed, or parsed whole), its chains with what the cache carried
    (the hashes, the previous chains, how many leading messages are the previous
    parse's objects) equal to chains worked out afresh."""
    cache, digests = BodyCache(1 << 22, min_body=0), None
    head = {"role": "system", "content": "An agent. " * 80}  # past the bytes bodies group by
    for step, mask in steps:
        messages = [head, *step]
        parsed = cache.parse(jsonio.dumps({"model": "m", "messages": messages}))
        parsed_messages = parsed.payload["messages"]
        memo = Memo(digests, parsed.known)
        assert chain_keys(parsed_messages, mask, memo) == chain_keys(messages, mask)
        assert exact_chain(parsed_messages, memo) == exact_chain(messages)
        digests = memo.kept()


def test_the_session_path_forwards_the_same_bytes_with_memos_and_without() -> None:
    conversations = traces.load(traces.locate("dev"), limit=6)
    for profile in (mixed, varied_clocks):
        with_memos = replay(1 << 17, profile, conversations)
        assert with_memos == replay(0, profile, conversations)
        assert len(with_memos) > 40


field_values = st.one_of(
    st.none(),
    st.text("~1:ab", max_size=3),  # the flat encoding's own framing, to confuse it
    st.sampled_from(["null", "é"]),
    st.integers(0, 2),
    st.booleans(),
    st.lists(st.text(max_size=2), max_size=2),
)


@st.composite
def messages_around_the_flat_size(draw: st.DrawFn) -> dict[str, Any]:
    """Messages whose content is a string near FLAT_MIN (either encoding), with fields of
    every JSON kind, and names and values made of the flat encoding's own framing."""
    size = draw(st.sampled_from([0, FLAT_MIN - 1, FLAT_MIN, FLAT_MIN + 7]))
    message: dict[str, Any] = {"content": draw(st.sampled_from('ab"\\é')) * size}
    keys = st.sampled_from(["role", "name", "tool_call_id"]) | st.text("~1:ab", max_size=3)
    message.update(draw(st.dictionaries(keys, field_values, max_size=3)))
    return message


@settings(max_examples=300)
@given(messages_around_the_flat_size(), messages_around_the_flat_size())
# Fields whose strings run together the same way: "a" + "b~" and "ab" + null (~).
@example({"content": "x" * FLAT_MIN, "a": "b~"}, {"content": "x" * FLAT_MIN, "ab": None})
def test_digests_are_equal_exactly_for_equal_json(first: Any, second: Any) -> None:
    """Whichever encoding a message's digest takes (its fields past FLAT_MIN, canonical
    JSON below it): key order aside, equal JSON gives equal digests, and different JSON
    different ones; the normal form's digest likewise."""
    same = jsonio.dumps_canonical(first) == jsonio.dumps_canonical(second)
    assert (exact_digest(first) == exact_digest(second)) == same
    reordered = dict(reversed(list(first.items())))
    assert exact_digest(reordered) == exact_digest(first)
    forms_equal = jsonio.dumps_canonical(normal_form(first)) == jsonio.dumps_canonical(
        normal_form(second)
    )
    assert (normal_digest(first) == normal_digest(second)) == forms_equal
