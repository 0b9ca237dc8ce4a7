"""Compaction's decisions without I/O: the compacted view of a request and where its folded
part ends (proxy.compaction.state), and the next event (proxy.compaction.planner)."""

from __future__ import annotations

from typing import Any

from proxy import config
from proxy.compaction import plan
from proxy.compaction.budget import Budget, Sizer
from proxy.compaction.planner import Planner, Summary
from proxy.compaction.state import Compaction, find_cut, view
from proxy.transcript import chain_keys

SYSTEM = {"role": "system", "content": "You are an agent."}
TASK = {"role": "user", "content": "Book flight ABC123 for me."}


class Words:
    """Tokens = words: sizes anyone can count by eye."""

    def count(self, text: str) -> int:
        return len(text.split())


def call(call_id: str, name: str = "search") -> dict[str, Any]:
    function = {"name": name, "arguments": "{}"}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, **{"type": "function", "function": function}}],
    }


def result(call_id: str, words: int) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": " ".join(["w"] * words)}


def conversation(rounds: int, words: int) -> list[dict[str, Any]]:
    messages = [SYSTEM, TASK]
    for index in range(rounds):
        messages += [call(f"c{index}"), result(f"c{index}", words)]
    return [*messages, {"role": "user", "content": "Now the hotel."}]


def planner(**overrides: Any) -> Planner:
    settings = config.load({"upstream": "http://engine", **overrides}, environ={})
    return Planner(settings, Sizer(Words()), in_context=False)


def snapshot(p: Planner, messages: list[Any], state: Compaction) -> Any:
    return p.snapshot(messages, chain_keys(messages), state, None)


def test_find_cut_follows_the_folded_message_wherever_it_moved() -> None:
    messages = conversation(3, 5)
    keys = chain_keys(messages)
    assert find_cut(Compaction(), keys) == 0  # nothing folded yet
    state = Compaction(cut_key=keys[4], cut_hint=1)  # a stale hint: found by key
    assert find_cut(state, keys) == 5 and state.cut_hint == 4
    assert find_cut(Compaction(cut_key=b"gone"), keys) is None  # the client rewrote it


def test_the_view_puts_the_stand_in_after_the_head_and_applies_elisions() -> None:
    messages = conversation(3, 5)
    keys = chain_keys(messages)
    stand_in = {"role": "user", "content": "Summary so far."}
    short = {"role": "tool", "tool_call_id": "c2", "content": "[elided]"}
    state = Compaction(cut_key=keys[3], stand_in=stand_in, elided={keys[7]: (short, 2)})
    sizes = [10] * len(messages)
    out = view(state, messages, keys, sizes, 2, 4, 3)
    assert out.messages == [SYSTEM, TASK, stand_in, *messages[4:7], short, messages[8]]
    assert out.sizes == [10, 10, 3, 10, 10, 10, 2, 10] and out.cut == 4


def test_old_large_tool_results_are_elided_first() -> None:
    p = planner(elide_min_tokens=50, elide_after_steps=1)
    messages = conversation(4, 300)
    state = Compaction()
    snap = snapshot(p, messages, state)
    budget = Budget.of(1600, p.settings)  # high 1200, soft 960: 4 x 300 words is over
    new, kind, fallback = p.transition(state, snap, budget, 0, None)
    assert (kind, fallback) == ("elide", "")
    assert len(new.elided) >= 2 and new.events == 1
    assert p.fits(new, snap, 0, budget.soft)
    assert state.elided == {} and state.events == 0  # the old state is left as it was


def test_a_ready_summary_replaces_the_turns_before_the_window() -> None:
    p = planner(elide_min_tokens=10_000)  # nothing to elide
    messages = conversation(6, 200)
    state = Compaction()
    snap = snapshot(p, messages, state)
    budget = Budget.of(2000, p.settings)
    ask = p.summary_ask(state, snap, budget, 0, {"model": "m", "messages": messages})
    assert ask is not None and 2 < ask.cut_index < len(messages)
    assert plan.safe_cut(messages, ask.cut_index) == ask.cut_index  # never inside a call
    ready = Summary("They searched six times.", ask.facts, ask.cut_key, ask.cut_index)
    new, kind, fallback = p.transition(state, snap, budget, 0, ready)
    assert (kind, fallback) == ("summary", "")
    assert new.cut_key == ask.cut_key and "They searched six times." in new.stand_in["content"]
    compacted = p.view(new, snap, ask.cut_index)
    assert compacted.messages[:2] == [SYSTEM, TASK]
    assert compacted.messages[-1] == messages[-1]
    assert p.estimate(compacted, snap, new) <= budget.high


def test_without_a_summary_the_oldest_turns_are_dropped_behind_a_marker() -> None:
    p = planner(elide_min_tokens=10_000)
    messages = conversation(6, 200)
    messages[3] = {**messages[3], "content": "Reservation XYZ789. " + messages[3]["content"]}
    state = Compaction()
    snap = snapshot(p, messages, state)
    budget = Budget.of(2000, p.settings)
    new, kind, _ = p.transition(state, snap, budget, 0, None)
    assert kind == "fallback" and new.cut_key is not None
    cut = find_cut(new, snap.keys)
    assert cut is not None and plan.safe_cut(messages, cut) == cut
    out = p.view(new, snap, cut).messages
    assert "[2 earlier messages" in out[2]["content"]
    assert "XYZ789" in out[2]["content"]  # the ids of what was dropped stay
    assert p.estimate(p.view(new, snap, cut), snap, new) <= budget.soft


def test_nothing_to_summarize_when_the_window_holds_everything() -> None:
    p = planner()
    messages = conversation(1, 5)
    state = Compaction()
    snap = snapshot(p, messages, state)
    budget = Budget.of(100_000, p.settings)
    assert p.summary_ask(state, snap, budget, 0, {"model": "m", "messages": messages}) is None
