"""Sessions, message keys, prefix continuity and history restoration (pure parts)."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy import prefix
from proxy.compaction.state import Compaction
from proxy.known import Known
from proxy.rewrite import RewriteContext
from proxy.rewrite.restore import restore_history
from proxy.sessions import MemoryStore, Session, fingerprint, identify
from proxy.transcript import chain_keys, exact_chain
from tests.support.stores import CodecStore

run = asyncio.run

SYSTEM = {"role": "system", "content": "You are an airline agent. Today is 2026-11-29."}
USER = {"role": "user", "content": "Change my flight ABC123 to Friday."}
EMITTED = {
    "role": "assistant",
    "content": None,
    "reasoning_content": "The user wants a change.",
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_reservation", "arguments": '{"id":"ABC123"}'},
        }
    ],
}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": '{"flights": 2}'}


def mask(text: str) -> str:
    return text.replace("2026-11-29", "<date>").replace("2026-11-30", "<date>")


def as_langchain_sends_it(message: dict) -> dict:
    """Arguments re-serialized with spaces, null content as "", reasoning dropped."""
    call = message["tool_calls"][0]
    arguments = json.dumps(json.loads(call["function"]["arguments"]))
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{**call, "function": {**call["function"], "arguments": arguments}}],
    }


@pytest.mark.parametrize(
    "changed",
    [
        as_langchain_sends_it(EMITTED),
        {**EMITTED, "content": ""},
        {k: v for k, v in EMITTED.items() if k != "reasoning_content"},
    ],
)
def test_form_changes_keep_the_key(changed: dict) -> None:
    assert chain_keys([SYSTEM, USER, changed]) == chain_keys([SYSTEM, USER, EMITTED])


def test_meaning_changes_change_the_key_and_every_later_one() -> None:
    other = copy.deepcopy(EMITTED)
    other["tool_calls"][0]["function"]["arguments"] = '{"id":"XYZ999"}'
    before = chain_keys([SYSTEM, USER, EMITTED, RESULT])
    after = chain_keys([SYSTEM, USER, other, RESULT])
    assert before[:2] == after[:2] and before[2] != after[2] and before[3] != after[3]


def test_volatile_values_of_the_system_prompt_do_not_change_keys() -> None:
    tomorrow = {**SYSTEM, "content": SYSTEM["content"].replace("29", "30")}
    assert chain_keys([tomorrow, USER], mask) == chain_keys([SYSTEM, USER], mask)
    assert chain_keys([tomorrow, USER]) != chain_keys([SYSTEM, USER])


class Detector:
    mask = key = staticmethod(mask)


def context(session: Session) -> RewriteContext:
    return RewriteContext(session=session, volatile=Detector())


def remembered_session() -> Session:
    session = Session("s")
    prefix.remember(session, [SYSTEM, USER], [SYSTEM, USER], None, EMITTED, 100, 20, mask)
    return session


def test_re_serialized_reply_is_restored_to_the_emitted_bytes() -> None:
    request = {"messages": [SYSTEM, USER, as_langchain_sends_it(EMITTED), RESULT]}
    restored = restore_history(request, context(remembered_session()))
    assert restored is not None
    assert restored["messages"] == [SYSTEM, USER, EMITTED, RESULT]
    assert request["messages"][2] != EMITTED  # the input is not mutated


def test_a_changed_meaning_is_forwarded_as_the_client_sent_it() -> None:
    edited = as_langchain_sends_it(EMITTED)
    edited["tool_calls"][0]["function"]["arguments"] = '{"id": "ZZZ"}'
    request = {"messages": [SYSTEM, USER, edited, RESULT]}
    assert restore_history(request, context(remembered_session())) is None


def test_continuity_reasons() -> None:
    session = remembered_session()
    tools = None
    grown = [SYSTEM, USER, EMITTED, RESULT]
    assert prefix.classify(None, grown, tools).reason == "new_session"
    same = prefix.classify(session, grown, tools)
    assert (same.reason, same.matched, same.expected_cached) == ("none", 3, 120)
    other_system = [{**SYSTEM, "content": "New rules."}, USER, EMITTED, RESULT]
    assert prefix.classify(session, other_system, tools).reason == "system_changed"
    rewritten = [SYSTEM, USER, as_langchain_sends_it(EMITTED), RESULT]
    broken = prefix.classify(session, rewritten, tools)
    assert (broken.reason, broken.matched) == ("history_rewritten", 2)
    assert prefix.classify(session, grown, [{"type": "function"}]).reason == "tools_changed"


def test_remember_keeps_the_forwarded_chain_with_the_reply() -> None:
    session = remembered_session()
    assert session.last_chain == tuple(exact_chain([SYSTEM, USER, EMITTED]))
    assert (session.last_prompt_tokens, session.last_completion_tokens) == (100, 20)


def test_system_prompts_are_never_restored() -> None:
    """Their volatile values move to the newest message on each request instead."""
    session = Session("s")
    stripped = {**SYSTEM, "content": "You are an airline agent."}
    prefix.remember(session, [SYSTEM, USER], [stripped, USER], None, EMITTED, 1, 1, mask)
    assert chain_keys([SYSTEM], mask)[0] not in session.substitutions


def test_identity_order_header_user_cache_key_fingerprint() -> None:
    request = {"messages": [SYSTEM, USER], "user": "u1", "prompt_cache_key": "k1"}
    assert identify({"x-session-id": "abc"}, request, mask) == ("h:abc", "header")
    assert identify({}, request, mask) == ("u:u1", "user")
    assert identify({}, {**request, "user": ""}, mask) == ("p:k1", "prompt_cache_key")
    key, source = identify({}, {"messages": [SYSTEM, USER]}, mask)
    assert source == "fingerprint"
    tomorrow = {**SYSTEM, "content": SYSTEM["content"].replace("29", "30")}
    assert identify({}, {"messages": [tomorrow, USER, EMITTED]}, mask)[0] == key
    other_task = {"role": "user", "content": "Cancel my flight."}
    assert identify({}, {"messages": [SYSTEM, other_task]}, mask)[0] != key


def test_a_continuing_request_takes_the_fingerprint_known_of_its_head() -> None:
    """With ``known`` (proxy.known), a request whose messages up to the first user message
    and tools are those the fingerprint was worked out for takes its key from there, as
    worked out (a marked key shows which); another first user message, other tools,
    another mask or a shorter list is worked out again."""
    tools = [{"type": "function", "function": {"name": "get_reservation", "parameters": {}}}]
    messages = [SYSTEM, USER, EMITTED, RESULT]
    known = Known()
    key = fingerprint({"messages": messages[:2], "tools": tools}, mask, known=known)
    assert key == fingerprint({"messages": messages[:2], "tools": tools}, mask)
    following = known.continued(messages)
    assert fingerprint({"messages": messages, "tools": tools}, mask, known=following) == key
    head = following.heads[(True, True)]
    following.heads[(True, True)] = (*head[:3], "marked")
    assert fingerprint({"messages": messages, "tools": tools}, mask, known=following) == "marked"
    other_task = {"role": "user", "content": "Cancel my flight."}
    other_tools = [{**tools[0], "function": {"name": "cancel", "parameters": {}}}]
    for request, its_mask in [
        ({"messages": [SYSTEM, other_task, *messages[2:]], "tools": tools}, mask),
        ({"messages": messages, "tools": other_tools}, mask),
        ({"messages": messages, "tools": tools}, str.upper),
        ({"messages": messages[:1], "tools": tools}, mask),
    ]:
        following.heads[(True, True)] = (*head[:3], "marked")
        found = fingerprint(request, its_mask, known=following)
        assert found == fingerprint(request, its_mask) != "marked"
    # The alias form (no system prompt) is carried apart from the session key's.
    alias = fingerprint({"messages": messages, "tools": tools}, mask, with_system=False)
    assert (
        fingerprint(
            {"messages": messages, "tools": tools}, mask, with_system=False, known=following
        )
        == alias
    )


def test_memory_store_is_bounded_by_count_and_idle_time() -> None:
    now = [0.0]
    store = MemoryStore(max_sessions=2, ttl_s=10, clock=lambda: now[0])
    for key in ("a", "b", "c"):
        assert run(store.save(Session(key)))
    assert run(store.get("a")) is None and len(store) == 2  # least recently used went first
    now[0] = 5
    assert run(store.get("b")) is not None  # touched at 5
    now[0] = 12
    assert run(store.get("c")) is None  # idle since 0
    assert run(store.get("b")) is not None


def test_the_store_hands_out_copies_and_saves_compare_and_set() -> None:
    store = MemoryStore(max_sessions=10, ttl_s=60)
    assert run(store.save(Session("s", compaction=Compaction())))
    first, second = run(store.get("s")), run(store.get("s"))
    assert first is not None and second is not None and first is not second
    first.substitute(b"k", {"role": "assistant", "content": "a"})
    first.pace.add_gap(2.0, keep=4)
    assert first.compaction is not None
    first.compaction.facts.append("the user's name is Ada")
    first.compaction.elided[b"k"] = ({"role": "tool", "content": "[elided]"}, 3)
    untouched = run(store.get("s"))
    assert untouched is not None and not untouched.substitutions and not untouched.pace.gaps
    assert untouched.compaction == Compaction()
    assert run(store.save(first)) and first.version == 2
    assert not run(store.save(second))  # loaded before first's save: it would undo it
    current = run(store.get("s"))
    assert current is not None and list(current.substitutions) == [b"k"]
    run(store.delete("s"))
    assert run(store.get("s")) is None and len(store) == 0


operations = st.lists(
    st.tuples(
        st.sampled_from(["copy", "substitute", "drop"]), st.integers(0, 7), st.integers(0, 3)
    ),
    max_size=40,
)


@given(operations)
def test_copies_share_substitutions_until_one_changes_them(steps) -> None:
    """Copies share their substitutions (a store copies on every get and save); a change
    to one record, by any path, leaves every other as it was."""
    records, expected = [Session("s")], [[]]
    for count, (operation, which, value) in enumerate(steps):
        index = which % len(records)
        if operation == "copy":
            records.append(records[index].copy())
            expected.append(list(expected[index]))
        elif operation == "substitute":
            key = bytes([count])
            records[index].substitute(key, {"n": count})
            expected[index].append(key)
        else:
            records[index].drop_oldest_substitutions(value)
            del expected[index][:value]
        assert [list(record.substitutions) for record in records] == expected


def test_substitutions_per_session_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("proxy.sessions.MAX_SUBSTITUTIONS", 3)
    session = Session("s")
    for index in range(5):
        session.substitute(bytes([index]), {"n": index})
    assert list(session.substitutions) == [bytes([2]), bytes([3]), bytes([4])]
    # Recorded again, a substitution is the most recent: the least recently recorded goes.
    session.substitute(bytes([2]), {"n": 2})
    session.substitute(bytes([5]), {"n": 5})
    assert list(session.substitutions) == [bytes([4]), bytes([2]), bytes([5])]


batches = st.lists(
    st.lists(st.tuples(st.integers(0, 12), st.integers(0, 3)), max_size=12), max_size=8
)


@given(batches, st.integers(0, 12), st.sampled_from([0, 1, 1 << 20]))
def test_substituting_many_at_once_is_substituting_them_one_by_one(
    batches: list[list[tuple[int, int]]], limit: int, few: int
) -> None:
    """``substitute_all`` leaves the very record (keys, order, messages, what is dropped
    at the bound) that one ``substitute`` after another does, whichever path it takes
    (``few``: below it, the loop), and no copy that shares the substitutions changes."""
    one_by_one, at_once = Session("s"), Session("s")
    with (
        mock.patch("proxy.sessions.MAX_SUBSTITUTIONS", limit),
        mock.patch("proxy.sessions.FEW_SUBSTITUTED", few),
    ):
        for batch in batches:
            pairs = [(bytes([key]), {"n": value}) for key, value in batch]
            before, shared = list(at_once.substitutions.items()), at_once.copy()
            for key, message in pairs:
                one_by_one.substitute(key, message)
            at_once.substitute_all(pairs)
            assert list(at_once.substitutions.items()) == list(one_by_one.substitutions.items())
            assert list(shared.substitutions.items()) == before


class Proxy:
    """The session side of the proxy in process: lookup, pipeline, continuity, recording."""

    def __init__(self, store: Any = None, memo_limit: int = 1 << 17) -> None:
        from prometheus_client import CollectorRegistry

        from proxy import config
        from proxy.app import default_transforms
        from proxy.metrics import Metrics
        from proxy.rewrite import Pipeline
        from proxy.rewrite.detector import VolatileDetector
        from proxy.tracker import SessionTracker

        self.detector = VolatileDetector()
        self.pipeline = Pipeline(default_transforms(config.Settings()))
        self.registry = CollectorRegistry()
        self.tracker = SessionTracker(
            store if store is not None else MemoryStore(10, 60),
            self.detector,
            Metrics(self.registry),
            memo_limit=memo_limit,
        )

    def step(
        self,
        messages: list,
        reply: dict,
        *,
        usage: bool = True,
        before_close: Any = None,
        prepared: bool = False,
    ) -> tuple[list, str]:
        """One request, its reply recorded, and what it posted in the background applied.
        ``before_close``: awaited with the turn before the reply is recorded; ``prepared``:
        the record's request-only part worked out first, as while the engine reads."""
        return asyncio.run(self._step(messages, reply, usage, before_close, prepared))

    async def _step(
        self, messages: list, reply: dict, usage: bool, before_close: Any, prepared: bool
    ) -> tuple[list, str]:
        from proxy.exchange import Exchange

        request = {"model": "m", "messages": copy.deepcopy(messages)}
        turn = await self.tracker.open({}, request)
        assert turn is not None
        context = RewriteContext(
            session=turn.session, volatile=self.detector, message_keys=turn.lookup_keys
        )
        forwarded = self.pipeline.apply(request, context).request
        exchange = Exchange("/v1/chat/completions", "POST", status=200)
        self.tracker.forward(turn, forwarded, exchange)
        if prepared:
            self.tracker.prepare(turn)
            assert turn.notes is not None and turn.substituted is not None
        exchange.usage = {"prompt_tokens": 10, "completion_tokens": 1} if usage else None
        exchange.reply = reply
        if before_close is not None:
            await before_close(turn)
        await self.tracker.close(turn, exchange)
        await self.tracker.settled()
        return forwarded["messages"], exchange.prefix_break


@pytest.fixture(params=["memory", "codec"])
def proxy(request: pytest.FixtureRequest) -> Proxy:
    """The same flows with the record kept as bytes between requests (a shared store)."""
    return Proxy(CodecStore() if request.param == "codec" else None)


def clocked(minute: int) -> dict:
    return {"role": "system", "content": f"Be brief.\nNow: 2026-11-29 10:{minute:02d}:00 UTC"}


def test_a_clocked_agent_keeps_its_prefix_and_sees_every_new_time(proxy: Proxy) -> None:
    answer = {"role": "assistant", "content": "Sure."}
    first, reason = proxy.step([clocked(1), USER], answer)
    assert reason == "new_session"
    assert first[0]["content"] == "Be brief."
    assert first[1]["content"].endswith("Now: 2026-11-29 10:01:00 UTC")
    follow = {"role": "user", "content": "And Saturday?"}
    second, reason = proxy.step([clocked(2), USER, answer, follow], answer)
    assert reason == "none" and second[:3] == [*first, answer]
    assert second[3]["content"].endswith("Now: 2026-11-29 10:02:00 UTC")
    third, reason = proxy.step([clocked(2), USER, answer, follow, answer, USER], answer)
    assert reason == "none" and third[:5] == [*second, answer]
    assert third[5] == USER  # the time did not change: no new note


def test_a_record_prepared_while_the_engine_reads_is_the_one_worked_out_after() -> None:
    """SessionTracker.prepare moves the request-only part of the record (substitutions,
    notes) to before the reply: every step forwards the same messages and the stores end
    with the same records, byte for byte, through notes, restored replies, a changed
    clock, a rewritten history and a second conversation."""
    plain, prepared = Proxy(CodecStore()), Proxy(CodecStore())
    answer = {"role": "assistant", "content": "Sure."}
    follow = {"role": "user", "content": "And Saturday?"}
    other = {"role": "system", "content": "Be terse.\nNow: 2026-11-29 11:00:00 UTC"}
    steps = [
        ([clocked(1), USER], EMITTED),
        ([clocked(2), USER, as_langchain_sends_it(EMITTED), RESULT], answer),
        ([clocked(2), USER, as_langchain_sends_it(EMITTED), RESULT, answer, follow], EMITTED),
        ([clocked(3), USER, follow], answer),  # a history rewritten by the client
        ([other, USER], answer),
        ([other, USER, answer, follow], EMITTED),
    ]
    for messages, reply in steps:
        assert plain.step(messages, reply) == prepared.step(messages, reply, prepared=True)
    records = [dict(proxy.tracker.store._records) for proxy in (plain, prepared)]
    assert records[0] == records[1] and len(records[0]) >= 2


def test_a_retried_request_is_forwarded_with_the_same_bytes(proxy: Proxy) -> None:
    answer = {"role": "assistant", "content": "Sure."}
    first, _ = proxy.step([clocked(1), USER], answer)
    again, _ = proxy.step([clocked(1), USER], answer)
    assert again == first  # one note, not none and not two


def test_an_upstream_without_usage_still_gets_history_restored(proxy: Proxy) -> None:
    emitted = EMITTED
    proxy.step([SYSTEM, USER], emitted, usage=False)
    sent, reason = proxy.step([SYSTEM, USER, as_langchain_sends_it(emitted), RESULT], emitted)
    assert reason == "none" and sent[2] == emitted


def test_two_requests_of_one_session_at_once_both_keep_their_replies(proxy: Proxy) -> None:
    """Two sub-agents with the same head (one session by fingerprint), in flight together:
    the second save finds the first's; its reply is recorded into the newer record."""
    from proxy.exchange import Exchange

    tracker = proxy.tracker
    other_task = {"role": "assistant", "content": "Which date?"}
    turns = []
    for reply in (EMITTED, other_task):
        request = {"model": "m", "messages": [SYSTEM, USER]}
        turn = run(tracker.open({}, request))
        assert turn is not None
        exchange = Exchange("/v1/chat/completions", "POST", status=200, reply=reply)
        tracker.forward(turn, request, exchange)
        turns.append((turn, exchange))
    for turn, exchange in turns:
        run(tracker.close(turn, exchange))
    assert proxy.registry.get_sample_value("prefill_proxy_session_conflicts_total") == 1
    sent, _ = proxy.step([SYSTEM, USER, as_langchain_sends_it(EMITTED), RESULT], EMITTED)
    assert sent[2] == EMITTED  # the first reply's exact bytes survived the second's save
