"""The synthetic conversations: deterministic, valid OpenAI conversations, shaped like the
recorded traces (proxy/replay/bundled/README.md), and none of their text."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from proxy.replay import synthetic, traces
from tests.unit.test_replay_traces import DEV

RECORDS = synthetic.generate(60, seed=0)


def content_chars(message: dict) -> int:
    chars = len(message.get("content") or "")
    for call in message.get("tool_calls") or []:
        chars += len(call["function"]["arguments"])
    return chars


def test_same_seed_same_conversations_other_seed_others() -> None:
    assert synthetic.generate(5, seed=0) == RECORDS[:5]  # a shorter set is a prefix
    assert json.dumps(synthetic.generate(5, seed=0)) == json.dumps(RECORDS[:5])
    assert synthetic.generate(5, seed=1) != RECORDS[:5]
    assert len({r["id"] for r in RECORDS}) == len(RECORDS)


def test_shape_matches_the_recorded_traces() -> None:
    systems = [r["messages"][0]["content"] for r in RECORDS]
    assert 6000 <= statistics.mean(map(len, systems)) <= 8000
    assert all(len(r["tools"]) == 14 for r in RECORDS)
    calls = [sum(m["role"] == "assistant" for m in r["messages"]) for r in RECORDS]
    assert 10.5 <= statistics.mean(calls) <= 13.5
    assert max(calls) <= 23
    total = sum(content_chars(m) for r in RECORDS for m in r["messages"])
    tool = sum(content_chars(m) for r in RECORDS for m in r["messages"] if m["role"] == "tool")
    assert 0.27 <= tool / total <= 0.40
    widths = [len(m["tool_calls"]) for r in RECORDS for m in r["messages"] if m.get("tool_calls")]
    parallel = [w for w in widths if w > 1]
    assert parallel and set(parallel) <= {2, 3}
    assert len(parallel) < len(widths) / 4  # some, not most


def test_conversations_share_system_prompt_and_tools_by_desk() -> None:
    heads = {(r["messages"][0]["content"], json.dumps(r["tools"])) for r in RECORDS}
    assert len(heads) == len(synthetic.DESKS) == 2
    assert {r["source"] for r in RECORDS} == {"synthetic/bookshop", "synthetic/telecom"}


@pytest.mark.parametrize("record", RECORDS[:20], ids=lambda r: r["id"])
def test_each_conversation_is_a_valid_openai_conversation(record: dict) -> None:
    messages = record["messages"]
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in record["tools"]}
    assert messages[0]["role"] == "system" and messages[1]["role"] == "user"
    assert messages[-1]["role"] == "user"  # a tail after the last answer, as in the traces
    k = 1
    while k < len(messages):
        message = messages[k]
        assert message["role"] in ("user", "assistant"), (k, message)
        k += 1
        if message["role"] == "assistant" and message.get("tool_calls"):
            assert message["content"] is None
            for call in message["tool_calls"]:
                result = messages[k]
                assert result == {**result, "role": "tool", "tool_call_id": call["id"]}
                assert isinstance(result["content"], str) and result["content"]
                _check_arguments(call["function"], schemas)
                k += 1
            assert messages[k]["role"] == "assistant"  # the model answers the results
        elif message["role"] == "assistant":
            assert isinstance(message["content"], str) and message["content"]
            assert messages[k]["role"] == "user"


def _check_arguments(function: dict, schemas: dict) -> None:
    schema = schemas[function["name"]]
    arguments = json.loads(function["arguments"])
    assert function["arguments"] == json.dumps(arguments)  # emitted json.dumps style
    assert set(schema["required"]) <= set(arguments) <= set(schema["properties"])
    for name, value in arguments.items():
        spec = schema["properties"][name]
        kinds = {"string": str, "integer": int, "boolean": bool, "array": list, "object": dict}
        assert isinstance(value, kinds[spec["type"]]), (name, value)
        if "enum" in spec:
            assert value in spec["enum"]


def test_replayable_like_a_trace_file(tmp_path: Path) -> None:
    path = tmp_path / "synthetic.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS[:4]))
    loaded = traces.load(path)
    assert [c.id for c in loaded] == [c.id for c in synthetic.conversations(4)]
    for conversation in loaded:
        steps = traces.steps(conversation)
        assistants = sum(m["role"] == "assistant" for m in conversation.messages)
        assert len(steps) == assistants
        assert any(step.after_tool for step in steps)


def test_no_text_from_the_recorded_traces() -> None:
    recorded = traces.load(DEV)
    recorded_text = "\n".join(
        m["content"] for c in recorded for m in c.messages if isinstance(m.get("content"), str)
    ) + json.dumps([c.tools for c in recorded])
    ours = {line for r in RECORDS[:2] for line in r["messages"][0]["content"].splitlines()}
    ours |= {t["function"]["description"] for r in RECORDS[:2] for t in r["tools"]}
    copied = [line for line in ours if len(line) > 40 and line in recorded_text]
    assert copied == []


def test_long_sessions_on_request_default_unchanged() -> None:
    assert synthetic.generate(3, seed=0, steps=None) == RECORDS[:3]
    long = synthetic.generate(2, seed=5, steps=120)
    assert long == synthetic.generate(2, seed=5, steps=120)  # deterministic by seed
    assert long != synthetic.generate(2, seed=6, steps=120)
    for record in long:
        calls = sum(m["role"] == "assistant" for m in record["messages"])
        assert 120 <= calls <= 124, calls
        assert record["id"].endswith("-120steps")
        # Opens like the short conversation of the same (seed, index): same customer.
        short = synthetic.generate(2, seed=5)[long.index(record)]
        assert record["messages"][:3] == short["messages"][:3]
    test_each_conversation_is_a_valid_openai_conversation(long[0])
    assert len(traces.steps(traces.parse(long[1]))) >= 120
