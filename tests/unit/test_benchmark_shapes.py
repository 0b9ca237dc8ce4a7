"""The warm-up matrix's synthetic sessions (tests/benchmarks/shapes.py) have the shape asked
for, and truncating a conversation keeps whole steps."""

from __future__ import annotations

import pytest

from proxy.replay import traces
from tests.benchmarks import warmup
from tests.benchmarks.shapes import Shape, sessions


def common_prefix(a: str, b: str) -> int:
    return next(
        (k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


@pytest.mark.parametrize("shared", [0.0, 0.5, 1.0])
def test_sessions_share_the_part_of_the_system_prompt_asked_for(shared: float) -> None:
    first, second = sessions(Shape(sessions=2, system_chars=4000, shared=shared))
    a, b = first.messages[0]["content"], second.messages[0]["content"]
    assert abs(len(a) - 4000) <= 1 and abs(len(b) - 4000) <= 1
    # Two texts of random words can agree on a few characters by chance, no more.
    assert abs(common_prefix(a, b) - 4000 * shared) <= 40
    assert first.tools == second.tools and first.messages[1] != second.messages[1]


def test_every_step_but_the_first_answers_the_parallel_calls_before_it() -> None:
    (conversation,) = sessions(Shape(sessions=1, tools=44, parallel=4, steps=6))
    steps = traces.steps(conversation)
    assert len(steps) == 6 and len(conversation.tools) == 44
    assert [s.after_tool for s in steps] == [False] + [True] * 5
    for step in steps[:-1]:
        assert len(step.reply["tool_calls"]) == 4
    assert "tool_calls" not in steps[-1].reply
    names = {t["function"]["name"] for t in conversation.tools}
    assert all(
        call["function"]["name"] in names for s in steps[:-1] for call in s.reply["tool_calls"]
    )


def test_the_same_seed_gives_the_same_sessions() -> None:
    shape = Shape(sessions=3)
    assert sessions(shape) == sessions(shape) != sessions(shape, seed=1)


def test_truncate_keeps_the_first_steps_and_ends_in_an_answer() -> None:
    (conversation,) = sessions(Shape(sessions=1, steps=8, parallel=2))
    cut = warmup.truncate(conversation, 3)
    steps = traces.steps(cut)
    assert [s.reply for s in steps[:2]] == [s.reply for s in traces.steps(conversation)[:2]]
    assert len(steps) == 3 and steps[2].messages == traces.steps(conversation)[2].messages
    # The last call answers in text: no warm-up waits for a step that never comes.
    assert "tool_calls" not in steps[2].reply and steps[2].reply["content"]
    assert warmup.truncate(conversation, None) is conversation
