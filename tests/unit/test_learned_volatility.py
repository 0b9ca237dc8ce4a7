"""Volatile lines learned from the session itself (proxy.rewrite.learned): what changed in
the system prompt between two requests of one conversation, in any format, moves to the
tail like a pattern line; an edit is not learned, and a line that stops changing goes
back."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.rewrite import learned
from proxy.rewrite.detector import DEFAULT_DETECTOR
from proxy.rewrite.volatile import NOTE_HEADER
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
    assert new == 0 and lines_of(edited) == set()  # words changed: a reason, not a clock


def lines_of(state: dict[bytes, int]) -> set[bytes]:
    """The learned lines' keys (not the places a change was seen, kept one request)."""
    return {key for key in state if len(key) == 8 or key[:1] == b"t"}


NOTES = [f"user said {word}" for word in ("alpha", "bravo", "charlie", "delta", "echo", "fox")]


def grown(step: int, notes: list[str] = NOTES) -> list[str]:
    return ["You are an agent.", "## Scratchpad", *notes[: step + 1], "", "Be brief."]


def test_a_growing_block_is_learned_from_its_first_growth() -> None:
    state: dict[bytes, int] = {}
    learned_by_step = []
    for step in range(1, 5):
        state, new = learned.learn(sigs(*grown(step - 1)), sigs(*grown(step)), state)
        learned_by_step.append(new)
    assert learned_by_step == [1, 1, 1, 1]
    test = learned.learned_line(state, MASK)
    assert test is not None
    moved = [line for line in grown(4) if test(line)]
    assert moved == NOTES[1:5]  # the first line was there from the start: it stays


def test_an_inserted_line_goes_back_when_nothing_more_is_inserted() -> None:
    """An instruction inserted once is learned (it might be a block's first growth), and
    goes back into the prefix after UNLEARN_AFTER requests without a change: never a
    permanently moved line."""
    base = ["You are an agent.", "Be brief."]
    added = sigs(base[0], "Use metric units.", base[1])
    state, new = learned.learn(sigs(*base), added, {})
    assert new == 1
    for _ in range(learned.UNLEARN_AFTER - 1):
        state, _ = learned.learn(added, added, state)
        assert lines_of(state)
    state, _ = learned.learn(added, added, state)
    assert state == {}


def test_an_edit_made_once_is_not_learned_nor_a_blank_line() -> None:
    a = sigs("You are an agent.", "Keep answers short.", "Be brief.")
    b = sigs("You are an agent.", "Answer in full sentences.", "Be brief.")
    state, new = learned.learn(a, b, {})
    assert new == 0
    state, _ = learned.learn(b, b, state)
    assert state == {}  # the place is remembered for one request only
    # Blank lines inserted twice at one place are never learned.
    blanks = ["a", "", "", "b"]
    learnable = [learned.learnable(line) for line in blanks]
    state, new = learned.learn(sigs("a", "", "b"), sigs(*blanks), {}, learnable)
    assert new == 0 and lines_of(state) == set()
    lines = [learned.learnable(line) for line in ("", "a", "", "---")]
    assert lines == [False, True, False, False]


def test_a_labelled_value_in_words_is_learned_at_once() -> None:
    a = sigs("You are an agent.", "Status: idle", "Open files: app.py", "Be brief.")
    b = sigs("You are an agent.", "Status: on a call", "Open files: app.py, cli.py", "Be brief.")
    _, new = learned.learn(a, b, {})
    assert new == 2
    # A label changed with its value is an edit: not learned at once.
    c = sigs("You are an agent.", "Mode: on a call", "Open files: app.py, cli.py", "Be brief.")
    _, new = learned.learn(b, c, {})
    assert new == 0


def test_a_block_edited_twice_in_a_row_is_learned_then_goes_back() -> None:
    a = ["You are an agent.", "The user is idle.", "Be brief."]
    b = ["You are an agent.", "The user is busy with a booking.", "Be brief."]
    c = ["You are an agent.", "The user waits for an answer.", "Be brief."]
    state, new = learned.learn(sigs(*a), sigs(*b), {})
    assert new == 0
    state, new = learned.learn(sigs(*b), sigs(*c), state)
    assert new == 1
    for _ in range(learned.UNLEARN_AFTER - 1):
        state, _ = learned.learn(sigs(*c), sigs(*c), state)
        assert lines_of(state)
    state, _ = learned.learn(sigs(*c), sigs(*c), state)
    assert state == {}  # it stopped changing: back into the prefix


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
    # Words changed: a new fingerprint, but the conversation goes on in its session (its
    # alias: tools and first user message, and the same first exchange); nothing learned.
    assert [reason for _, reason in steps] == ["new_session", "none", "system_changed", "none"]
    assert steps[3][0][0]["content"] == "You are a booking agent.\nBe concise."
    assert not proxy.registry.get_sample_value("prefill_proxy_volatile_lines_learned_total")
    loaded = "prefill_proxy_sessions_loaded_total"
    assert proxy.registry.get_sample_value(loaded, {"outcome": "continued"}) == 2


def test_a_growing_scratchpad_keeps_the_prefix_from_its_first_growth() -> None:
    proxy = Proxy(CodecStore())
    steps = run(proxy, ["\n".join(grown(step)) for step in range(6)])
    reasons = [reason for _, reason in steps]
    assert reasons == ["new_session", "none", "none", "none", "none", "none"]
    systems = [forwarded[0]["content"] for forwarded, _ in steps]
    assert len(set(systems)) == 1  # the block's first line stays, what it gains moves
    for step, (forwarded, _) in enumerate(steps):
        text = "\n".join(str(m["content"]) for m in forwarded)
        for line in grown(step):
            if line:
                assert line in text  # nothing lost
        newest = str(forwarded[-1]["content"])
        if step >= 1:
            assert NOTE_HEADER in newest and grown(step)[step + 2] in newest
    loaded = "prefill_proxy_sessions_loaded_total"
    assert proxy.registry.get_sample_value(loaded, {"outcome": "continued"}) == 5


def test_two_conversations_with_one_head_do_not_join() -> None:
    """Same tools and first user message, other system prompts and first replies: each
    its own session, and neither gets the other's history restored."""
    proxy = Proxy(CodecStore())
    first = conversation_step("You are agent A.", 0)
    proxy.step(first, {"role": "assistant", "content": "A here.", "reasoning_content": "a"})
    other = conversation_step("You are agent B.", 0)
    proxy.step(other, {"role": "assistant", "content": "B here."})
    # B's next step, with B's system prompt changed: its own session or a new one, never A's.
    follow = [
        {"role": "system", "content": "You are agent B, now busy."},
        other[1],
        {"role": "assistant", "content": "B here."},
        {"role": "user", "content": "Go on."},
    ]
    forwarded, reason = proxy.step(follow, {"role": "assistant", "content": "Done."})
    assert reason in ("system_changed", "new_session")
    assert forwarded[2] == {"role": "assistant", "content": "B here."}
    # A's continuation with A's exact reply restores A's reasoning (its own history).
    again = [first[0], first[1], {"role": "assistant", "content": "A here."}, follow[3]]
    forwarded, reason = proxy.step(again, {"role": "assistant", "content": "Done."})
    assert reason == "none" and forwarded[2].get("reasoning_content") == "a"


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


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(LINE, min_size=2, max_size=8, unique=True),
    position=st.integers(min_value=0, max_value=8),
    entries=st.lists(LINE, min_size=6, max_size=6, unique=True),
)
def test_any_growing_block_leaves_a_byte_stable_system_prompt(
    lines: list[str], position: int, entries: list[str]
) -> None:
    """A block that gains a line on every step, anywhere in any prompt: the forwarded
    system prompt is byte-stable from the first request, and every line the client's
    prompt has is in the forwarded conversation."""
    entries = [f"- note {entry}" for entry in entries if f"- note {entry}" not in lines]
    at = min(position, len(lines))

    def system(step: int) -> list[str]:
        return [*lines[:at], *entries[: step + 1], *lines[at:]]

    steps = len(entries)
    proxy = Proxy(CodecStore())
    done = run(proxy, ["\n".join(system(step)) for step in range(steps)])
    forwarded_systems = [forwarded[0]["content"] for forwarded, _ in done]
    assert len(set(forwarded_systems)) == 1
    for step, (forwarded, _) in enumerate(done):
        text = "\n".join(str(m["content"]) for m in forwarded)
        for line in system(step):
            assert line in text


def test_history_is_restored_while_a_block_grows_and_a_clock_ticks() -> None:
    """A client that drops the reasoning of its history gets it restored at every step
    while its system prompt changes in learned ways (the chain keys leave learned lines
    out), including the step that learns."""
    proxy = Proxy(CodecStore())
    for step in range(6):
        system = "\n".join([f"Step {step + 1} of 60.", *grown(step)])
        messages = conversation_step(system, step)
        reply = {"role": "assistant", "content": f"Answer {step}.", "reasoning_content": f"r{step}"}
        forwarded, reason = proxy.step(messages, reply)
        assistants = [m for m in forwarded if m.get("role") == "assistant"]
        restored = [m.get("reasoning_content") for m in assistants]
        assert restored == [f"r{index}" for index in range(step)], (step, reason)


def test_a_note_says_only_what_the_history_does_not_carry_yet() -> None:
    """A growing block: each step's note carries the line it gained, not the whole block
    again (the notes before are in the history); a client that dropped the messages that
    carried the notes gets every line again."""
    proxy = Proxy(CodecStore())
    steps = run(proxy, ["\n".join(grown(step)) for step in range(5)])
    for step, (forwarded, _) in enumerate(steps[1:], start=1):
        newest = str(forwarded[-1]["content"])
        note = newest.split(NOTE_HEADER, 1)[1].strip().split("\n")
        assert note == [NOTES[step]]  # the gained line only
    # The client keeps its first exchange and the newest message: the notes are gone
    # with the rest, so the note says it all.
    trimmed = conversation_step("\n".join(grown(5)), 5)
    trimmed = [*trimmed[:3], trimmed[-1]]
    forwarded, _ = proxy.step(trimmed, {"role": "assistant", "content": "Answer 5."})
    note = str(forwarded[-1]["content"]).split(NOTE_HEADER, 1)[1].strip().split("\n")
    assert note == NOTES[1:6]


def test_a_clock_one_conversation_taught_moves_from_the_first_request_of_the_next() -> None:
    """Conversations sharing a system prompt share what they learned: the second one's
    first request already moves the clock, so its second step is cached. A shape seeds
    UNLEARN_AFTER new sessions, then a session that learns it again renews it."""
    proxy = Proxy(CodecStore())

    def conversation(number: int) -> tuple[list[str], bool]:
        """(prefix-break reasons, whether the first request kept the clock in place)."""
        opening = {"role": "user", "content": f"Task {number}."}
        reasons, kept = [], False
        for step in range(3):
            clock = f"It is now 08:{number % 60:02d}:{step:02d}."
            system = f"You are a booking agent.\n{clock}\nBe brief."
            messages = [{"role": "system", "content": system}, opening]
            for index in range(step):
                messages.append({"role": "assistant", "content": f"Answer {index}."})
                messages.append({"role": "user", "content": f"Question {index + 1}?"})
            reply = {"role": "assistant", "content": f"Answer {step}."}
            forwarded, reason = proxy.step(messages, reply)
            kept = kept or (step == 0 and clock in forwarded[0]["content"])
            reasons.append(reason)
        return reasons, kept

    learns = (["new_session", "volatile_learned", "none"], True)
    seeded = (["new_session", "none", "none"], False)
    assert conversation(0) == learns
    for number in range(1, learned.UNLEARN_AFTER + 1):
        assert conversation(number) == seeded
    # The family forgot it: the next conversation learns it again, and renews it.
    assert conversation(learned.UNLEARN_AFTER + 1) == learns
    assert conversation(learned.UNLEARN_AFTER + 2) == seeded


def test_notes_stay_deltas_when_a_save_loses_its_race() -> None:
    """Background work (a warm-up's flag) saves the record between a request's load and
    its save: the reply is recorded into the fresher record, and the notes it placed are
    the same as without the race (the next note still carries only the new line)."""
    import asyncio

    proxy = Proxy(CodecStore())
    run(proxy, ["\n".join(grown(step)) for step in range(2)])

    async def warmed(turn: Any) -> None:  # saved by another task before the reply
        assert await proxy.tracker.apply(turn.session.key, lambda s: setattr(s, "warmed", True))

    def raced(step: int) -> list[Any]:
        messages = conversation_step("\n".join(grown(step)), step)
        reply = {"role": "assistant", "content": f"Answer {step}."}
        return proxy.step(messages, reply, before_close=warmed)[0]

    for step in (2, 3, 4):
        newest = str(raced(step)[-1]["content"])
        assert newest.split(NOTE_HEADER, 1)[1].strip().split("\n") == [NOTES[step]]
    # What each raced request learned was kept: the record compares with the last one.
    key = next(key for key in proxy.tracker.store._records if key.startswith("f:"))
    record = asyncio.run(proxy.tracker.store.get(key))
    assert record is not None
    assert record.system_lines == tuple(sigs(*grown(4)))
    test = learned.learned_line(record.learned, MASK)
    assert test is not None and [line for line in grown(4) if test(line)] == NOTES[1:5]
