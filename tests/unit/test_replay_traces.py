"""Step enumeration on the real traces (proxy/replay/bundled/README.md, "Replay semantics")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.replay import traces

# The dev traces ship inside the package (proxy/replay/bundled/), so a clone has them.
DEV = traces.bundled("dev")


@pytest.fixture(scope="module")
def conversations() -> list[traces.Conversation]:
    return traces.load(DEV)


def test_the_traces_ship_inside_the_repository() -> None:
    root = Path(__file__).resolve().parents[2]
    assert DEV.is_file() and DEV.resolve().is_relative_to(root), DEV
    for name in ("LICENSE-tau-bench", "LICENSE-tau2-bench", "README.md"):
        assert (DEV.parent / name).is_file(), name


def test_a_short_name_locates_the_bundled_traces(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert traces.locate("dev") == DEV
    (tmp_path / "dev").write_text("")  # a file of that name where the user runs wins
    assert traces.locate("dev") == Path("dev")
    assert traces.locate("other.jsonl") == Path("other.jsonl")


def test_688_model_calls_in_60_conversations(conversations) -> None:
    assert len(conversations) == 60
    assistants = sum(1 for c in conversations for m in c.messages if m["role"] == "assistant")
    injected = sum(len(c.injected) for c in conversations)
    assert (assistants, injected) == (728, 40)
    # The README's 688 model calls are the assistant messages less the injected ones.
    assert traces.count_steps(conversations) == assistants - injected == 688


def test_each_step_sends_the_recorded_prefix_and_expects_the_recorded_answer(
    conversations,
) -> None:
    for conversation in conversations:
        steps = traces.steps(conversation)
        assert [s.index for s in steps] == list(range(len(steps)))
        for step in steps:
            assert step.position not in conversation.injected
            assert step.reply is conversation.messages[step.position]
            assert step.reply["role"] == "assistant"
            assert step.messages == conversation.messages[: step.position]
            assert step.messages[0]["role"] == "system"


def test_injected_greetings_are_never_requested(conversations) -> None:
    tau2 = [c for c in conversations if c.source.startswith("tau2/")]
    assert tau2 and all(c.injected == {1} for c in tau2)
    for conversation in tau2:
        first = traces.steps(conversation)[0]
        assert first.position > 1
        assert first.messages[1]["role"] == "assistant"  # the greeting stays in the history


def test_messages_after_the_last_assistant_message_are_never_sent(conversations) -> None:
    for conversation in conversations:
        last_assistant = max(
            k for k, m in enumerate(conversation.messages) if m["role"] == "assistant"
        )
        assert last_assistant < len(conversation.messages) - 1  # every trace has a tail
        longest = max(len(s.messages) for s in traces.steps(conversation))
        assert longest == last_assistant


def test_after_tool_marks_steps_that_answer_tool_results(conversations) -> None:
    steps = [s for c in conversations for s in traces.steps(c)]
    after_tool = [s for s in steps if s.after_tool]
    assert after_tool and len(after_tool) < len(steps)
    assert all(s.messages[-1]["role"] == "tool" for s in after_tool)
    assert all(s.messages[-1]["role"] != "tool" for s in steps if not s.after_tool)


def test_sampling_parameters_come_from_meta_request(conversations) -> None:
    by_source = {c.source.split("/")[0]: c.request for c in conversations}
    assert by_source["taubench"] == {"temperature": 0.0, "tool_choice": None}
    assert by_source["tau2"]["tool_choice"] == "auto"


def test_limit_reads_the_first_conversations(conversations) -> None:
    first = traces.load(DEV, limit=3)
    assert [c.id for c in first] == [c.id for c in conversations[:3]]


def test_bad_lines_are_reported_with_their_place(tmp_path: Path) -> None:
    good = {"id": "a", "messages": [{"role": "system", "content": "s"}]}
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(good) + "\n\n{not json\n")
    with pytest.raises(traces.TraceError, match=r"t\.jsonl:3"):
        traces.load(path)
    path.write_text(json.dumps({"id": "b", "messages": "nope"}) + "\n")
    with pytest.raises(traces.TraceError, match="'b'"):
        traces.load(path)


def test_an_assistant_message_first_is_not_a_request() -> None:
    conversation = traces.parse({"id": "x", "messages": [{"role": "assistant", "content": "hi"}]})
    assert traces.steps(conversation) == []
