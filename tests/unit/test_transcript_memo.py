"""The per-session digest memo (proxy.transcript.Memo) is a shortcut, not another answer:
chain keys and exact chains are the same with it as without, and the whole session path
forwards byte-identical requests with memos on and off (issue 16's equivalence test)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import jsonio
from proxy.replay import traces
from proxy.replay.profiles import Prompt, mixed, varied_clocks
from proxy.rewrite.volatile import DEFAULT_DETECTOR
from proxy.transcript import Memo, chain_keys, exact_chain
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
    # proxy.bodies hands the next step the earlier parse's objects and their hashes.
    hashes: dict[int, Any] = {}
    head = messages[:cut]
    earlier = Memo(None, hashes)
    assert chain_keys(head, MASK, earlier) == chain_keys(head, MASK)
    assert {id(m) for m in head if m.get("role") not in ("system", "developer")} <= hashes.keys()
    again = [*head, *copy.deepcopy(messages[cut:])]  # the same objects, then new ones
    kept = {id(m): hashes[id(m)] for m in again if id(m) in hashes}
    memo = Memo(earlier.kept(), kept)
    assert chain_keys(again, MASK, memo) == chain_keys(messages, MASK)
    assert exact_chain(again, memo) == exact_chain(messages)


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


def test_the_session_path_forwards_the_same_bytes_with_memos_and_without() -> None:
    conversations = traces.load(traces.locate("dev"), limit=6)
    for profile in (mixed, varied_clocks):
        with_memos = replay(1 << 17, profile, conversations)
        assert with_memos == replay(0, profile, conversations)
        assert len(with_memos) > 40
