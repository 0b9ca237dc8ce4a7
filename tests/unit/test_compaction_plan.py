"""Where compaction cuts, and the stand-ins it writes (proxy.compaction.plan)."""

from __future__ import annotations

from proxy.compaction import plan

SYSTEM = {"role": "system", "content": "You are an agent."}
TASK = {"role": "user", "content": "Book a flight."}


def call(call_id: str, name: str = "search") -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}
        ],
    }


def result(call_id: str, text: str = "ok") -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


CONVERSATION = [
    SYSTEM,
    TASK,
    call("a"),
    result("a"),
    {"role": "assistant", "content": "Found it."},
    {"role": "user", "content": "Go on."},
    call("b", "book"),
    result("b"),
]


def test_head_is_the_system_prompts_and_the_first_user_message() -> None:
    assert plan.head_length(CONVERSATION) == 2
    assert plan.head_length([SYSTEM, {"role": "developer", "content": "x"}, TASK, TASK]) == 3
    assert plan.head_length([TASK]) == 1
    assert plan.head_length([call("a")]) == 0


def test_a_cut_never_separates_tool_results_from_their_call() -> None:
    assert plan.safe_cut(CONVERSATION, 3) == 2  # result a -> back to its call
    assert plan.safe_cut(CONVERSATION, 7) == 6
    assert plan.safe_cut(CONVERSATION, 4) == 4
    assert plan.safe_cut(CONVERSATION, 3, floor=3) == 3


def test_window_keeps_the_newest_turn_whatever_its_size() -> None:
    sizes = [10, 10, 10, 500, 10, 10, 10, 500]
    assert plan.window_start(sizes, CONVERSATION, 2, tokens=5) == 6
    assert plan.window_start(sizes, CONVERSATION, 2, tokens=530) == 4
    assert plan.window_start(sizes, CONVERSATION, 2, tokens=10_000) == 2


def test_cut_to_fit_counts_the_fixed_part() -> None:
    sizes = [10] * len(CONVERSATION)
    assert plan.cut_to_fit(sizes, CONVERSATION, 2, fixed=30, target=60) == 5
    assert plan.cut_to_fit(sizes, CONVERSATION, 2, fixed=0, target=1_000) == 2


def test_old_large_tool_results_are_elision_candidates() -> None:
    sizes = [10, 10, 10, 900, 10, 10, 10, 900]
    found = plan.elision_candidates(CONVERSATION, sizes, 2, 8, min_tokens=100, after_steps=2)
    assert found == [3]  # result b is followed by no model call yet
    assert plan.elision_candidates(CONVERSATION, sizes, 2, 8, min_tokens=100, after_steps=3) == []
    assert plan.elision_candidates(CONVERSATION, sizes, 2, 8, min_tokens=0, after_steps=0) == []


def test_an_elided_result_names_its_tool_size_and_beginning() -> None:
    assert plan.tool_name(CONVERSATION, 7) == "book"
    stand_in = plan.elided(result("b", "flight UA 100 " * 50), "book", 900)
    assert stand_in["role"] == "tool" and stand_in["tool_call_id"] == "b"
    assert "book" in stand_in["content"] and "900 tokens" in stand_in["content"]
    assert "It began: flight UA 100" in stand_in["content"]
    assert len(stand_in["content"]) < 400


def test_compacted_puts_the_stand_in_after_the_head() -> None:
    marker = plan.marker(3)
    out = plan.compacted(CONVERSATION, 2, marker, 5)
    assert out == [SYSTEM, TASK, marker, *CONVERSATION[5:]]
    assert "3 earlier messages" in marker["content"]
    assert len(plan.marker()["content"]) < len(marker["content"])
