"""Volatile lines learned from the session itself (proxy.rewrite.learned): what changed in
the system prompt between two requests of one conversation, in any format, moves to the
tail like a pattern line; an edit is not learned, and a line that stops changing goes
back."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.rewrite import learned
from proxy.rewrite.volatile import DEFAULT_DETECTOR, NOTE_HEADER
from tests.unit.test_sessions import CodecStore, Proxy

MASK = DEFAULT_DETECTOR.mask


def sigs(*lines: str) -> list[bytes]:
    return [learned.signature(line, MASK) for line in lines]


def test_a_value_that_changes_is_learned_at_once_an_edit_is_not() -> None:
    previous = sigs("You are an agent.", "It is now 08:07.", "Be brief.")
    clock, new = learned.learn(
        previous, sigs("You are an agent.", "It is now 08:08.", "Be brief."), {}
    )
    assert new == 1 and list(clock) == [learned.shape_key("It is now 08:07.", MASK)]
    edited, new = learned.learn(
        previous, sigs("You are an agent.", "It is now 08:07.", "Be concise."), {}
    )
    assert new == 0 and edited == {}  # words changed: a reason, not a clock


def test_a_learned_line_that_stops_changing_goes_back() -> None:
    lines = sigs("Max results: 5", "Be brief.")
    state, new = learned.learn(lines, sigs("Max results: 10", "Be brief."), {})
    assert new == 1
    same = sigs("Max results: 10", "Be brief.")
    for _ in range(learned.UNLEARN_AFTER - 1):
        state, _ = learned.learn(same, same, state)
        assert state
    state, _ = learned.learn(same, same, state)
    assert state == {}


def conversation_step(system: str, step: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    messages.append({"role": "user", "content": "Book a table for two."})
    for index in range(step):
        messages.append({"role": "assistant", "content": f"Answer {index}."})
        messages.append({"role": "user", "content": f"Question {index + 1}?"})
    return messages


def run(proxy: Proxy, systems: list[str]) -> list[tuple[list[Any], str]]:
    return [
        proxy.step(
            conversation_step(system, step), {"role": "assistant", "content": f"Answer {step}."}
        )
        for step, system in enumerate(systems)
    ]


def test_a_clock_no_pattern_knows_is_moved_from_the_second_step() -> None:
    proxy = Proxy(CodecStore())
    systems = [
        f"You are a booking agent.\nIt is now 08:0{n} on 29 November.\nBe brief." for n in range(5)
    ]
    steps = run(proxy, systems)
    reasons = [reason for _, reason in steps]
    assert reasons == ["new_session", "volatile_learned", "none", "none", "none"]
    first = steps[0][0][0]["content"]
    assert "It is now 08:00" in first  # nothing learned yet: forwarded as sent
    stable = {forwarded[0]["content"] for forwarded, _ in steps[1:]}
    assert stable == {"You are a booking agent.\nBe brief."}
    for n, (forwarded, _) in enumerate(steps):
        text = "\n".join(str(m["content"]) for m in forwarded)
        assert text.count(f"It is now 08:0{n} on 29 November.") == 1  # its value, once
    assert proxy.registry.get_sample_value("prefill_proxy_volatile_lines_learned_total") == 1


def test_an_edited_system_prompt_is_a_change_not_a_learned_line() -> None:
    proxy = Proxy()
    systems = ["You are a booking agent.\nBe brief."] * 2 + [
        "You are a booking agent.\nBe concise."
    ] * 2
    steps = run(proxy, systems)
    # Words changed: the fingerprint too (a new session by it), and nothing is learned.
    assert [reason for _, reason in steps] == ["new_session", "none", "new_session", "none"]
    assert steps[3][0][0]["content"] == "You are a booking agent.\nBe concise."
    assert not proxy.registry.get_sample_value("prefill_proxy_volatile_lines_learned_total")


LINE = st.text(alphabet="abcdefgh ", min_size=3, max_size=20).map(str.strip).filter(bool)


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(LINE, min_size=2, max_size=8, unique=True),
    changing=st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_any_changing_lines_leave_a_byte_stable_system_prompt(
    lines: list[str], changing: list[bool]
) -> None:
    """For any system prompt in which some lines carry a number that changes on every
    step: from the third request the forwarded system prompt is byte-stable, and the
    conversation forwarded carries each changing line's latest value exactly once."""
    moving = [i for i in range(len(lines)) if changing[i]]
    if not moving:
        moving = [0]

    def system(step: int) -> str:
        return "\n".join(
            f"{line} {1000 + 100 * step + i}" if i in moving else line
            for i, line in enumerate(lines)
        )

    proxy = Proxy(CodecStore())
    steps = run(proxy, [system(step) for step in range(5)])
    forwarded_systems = [forwarded[0]["content"] for forwarded, _ in steps]
    assert len(set(forwarded_systems[2:])) == 1
    for step, (forwarded, _) in enumerate(steps):
        text = "\n".join(str(m["content"]) for m in forwarded)
        for i in moving:
            assert text.count(f"{lines[i]} {1000 + 100 * step + i}") == 1
        if step >= 1:
            assert NOTE_HEADER in text
