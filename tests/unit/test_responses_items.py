"""The Responses request as a chat conversation and back (proxy.responses.items)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import bodies
from proxy.responses import events, items
from proxy.rewrite.canonical_tools import canonical_tools
from proxy.rewrite.pipeline import RewriteContext
from proxy.rewrite.volatile import NOTE_HEADER, move_volatile
from proxy.transcript import Memo, chain_keys

TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": False,
}
CALL = {
    "id": "fc_1",
    "type": "function_call",
    "call_id": "call_1",
    "name": "get_weather",
    "arguments": '{"city":"Paris"}',
    "status": "completed",
}
REASONING = {
    "id": "rs_1",
    "type": "reasoning",
    "summary": [],
    "content": [{"type": "reasoning_text", "text": "The user wants weather."}],
}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"}


def request(**fields: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "instructions": "You are helpful.\nCurrent time: 2026-12-02 10:15:42",
        "input": [
            {"role": "user", "content": "Weather in Paris?"},
            REASONING,
            CALL,
            OUTPUT,
        ],
        "tools": [TOOL],
        "stream": True,
        **fields,
    }


def test_the_conversation_reads_as_vllm_renders_it() -> None:
    chat = items.to_chat(request())
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["system", "user", "assistant", "tool"]
    assistant = chat["messages"][2]
    assert assistant["content"] is None
    assert assistant["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
        }
    ]
    assert assistant[items.SOURCE] == [REASONING, CALL]
    assert chat["messages"][3]["tool_call_id"] == "call_1"
    assert chat["tools"][0]["function"]["name"] == "get_weather"


def test_an_unchanged_conversation_goes_back_as_the_same_request() -> None:
    original = request()
    assert items.to_responses(original, items.to_chat(original)) is original


def test_a_string_input_stays_a_string() -> None:
    original = {"model": "m", "input": "hi", "instructions": "Be brief.\nToday is 2026-12-02."}
    chat = items.to_chat(original)
    moved = move_volatile(chat, RewriteContext())
    assert moved is not None
    wire = items.to_responses(original, moved)
    assert wire["instructions"] == "Be brief."  # the line moved out
    assert isinstance(wire["input"], str) and wire["input"].startswith("hi")
    assert NOTE_HEADER in wire["input"] and "2026-12-02" in wire["input"]


def test_a_note_is_written_into_the_items_own_shape() -> None:
    original = request()
    moved = move_volatile(items.to_chat(original), RewriteContext())
    assert moved is not None
    wire = items.to_responses(original, moved)
    assert "10:15:42" not in wire["instructions"]
    *history, last = wire["input"]
    assert history == original["input"][:-1]  # every item before the newest as sent
    assert last["type"] == "function_call_output" and last["call_id"] == "call_1"
    assert last["output"].startswith("Sunny, 21 C") and "10:15:42" in last["output"]


def test_text_parts_keep_their_type() -> None:
    user = {
        "type": "message",
        "role": "user",
        "id": "msg_1",
        "content": [{"type": "input_text", "text": "Weather?"}],
    }
    original = {"model": "m", "instructions": "Now: 2026-12-02 10:15:42", "input": [user]}
    moved = move_volatile(items.to_chat(original), RewriteContext())
    assert moved is not None
    (item,) = items.to_responses(original, moved)["input"]
    assert item["id"] == "msg_1"
    assert [part["type"] for part in item["content"]] == ["input_text", "input_text"]


def test_tools_in_canonical_order_go_back_flat() -> None:
    other = {**TOOL, "name": "book_flight", "parameters": {"type": "object", "properties": {}}}
    original = request(tools=[TOOL, other])
    canonical = canonical_tools(items.to_chat(original), RewriteContext())
    assert canonical is not None
    wire = items.to_responses(original, canonical)
    assert [t["name"] for t in wire["tools"]] == ["book_flight", "get_weather"]
    assert all(
        set(t) == {"type", "name", "description", "parameters", "strict"} for t in wire["tools"]
    )
    assert wire["input"] == original["input"]
    builtin = {"type": "web_search"}
    assert items.chat_tool(builtin) is builtin and items.responses_tool(builtin) is builtin


def test_unknown_items_stay_where_they_were() -> None:
    search = {"type": "web_search_call", "id": "ws_1", "status": "completed"}
    reference = {"type": "item_reference", "id": "msg_0"}
    original = request(input=[reference, {"role": "user", "content": "go"}, search, CALL, OUTPUT])
    chat = items.to_chat(original)
    assert [m["role"] for m in chat["messages"]][:3] == ["system", items.OPAQUE, "user"]
    changed = {**chat, "parallel_tool_calls": True}
    wire = items.to_responses(original, changed)
    assert wire["input"] == original["input"] and wire["parallel_tool_calls"] is True


def test_a_reply_is_the_assistant_turn_the_client_sends_back() -> None:
    text = {
        "id": "msg_2",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}],
    }
    response = {"id": "resp_1", "output": [REASONING, text, CALL], "usage": {"input_tokens": 9}}
    reply = events.reply_message(response)
    assert reply is not None
    assert reply["content"] == "Let me check." and len(reply["tool_calls"]) == 1
    sent_back = items.to_chat({"model": "m", "input": [REASONING, text, CALL]})["messages"]
    assert sent_back == [reply]
    assert items.message_items(reply) == [REASONING, text, CALL]
    assert events.usage(response) == {
        "prompt_tokens": 9,
        "completion_tokens": None,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_a_stand_in_becomes_a_message_item() -> None:
    original = request()
    chat = items.to_chat(original)
    summary = {"role": "user", "content": "[Summary] The user asked for weather."}
    compacted = {**chat, "messages": [chat["messages"][0], summary, *chat["messages"][2:]]}
    wire = items.to_responses(original, compacted)
    assert wire["input"][0] == {"type": "message", "role": "user", "content": summary["content"]}
    assert wire["input"][1:] == [REASONING, CALL, OUTPUT]


def test_sources_stay_out_of_engine_chat_requests() -> None:
    chat = items.to_chat(request())
    stripped = items.strip_sources(chat["messages"])
    assert all(items.SOURCE not in m for m in stripped)
    assert all(items.SOURCE in m for m in chat["messages"])  # the input is left as it was


def test_an_input_the_mapping_cannot_read_is_refused() -> None:
    for bad in ({"input": 3}, {"input": ["x"]}, {"input": "hi", "instructions": 4}):
        with pytest.raises(items.NotAConversation):
            items.to_chat({"model": "m", **bad})


# Any conversation of these items: the request goes back as it came, and changing the
# newest item's text changes only that item.
_text = st.text(min_size=0, max_size=12)
_parts = st.lists(
    st.builds(lambda t, k: {"type": k, "text": t}, _text, st.sampled_from(["input_text", "text"])),
    min_size=1,
    max_size=2,
)
_user = st.builds(
    lambda c, r: {"role": r, "content": c},
    st.one_of(_text, _parts),
    st.sampled_from(["user", "developer"]),
)
_call = st.builds(
    lambda i, a: {"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": a},
    st.integers(0, 3),
    st.sampled_from(['{"a":1}', '{"a": 1}', "{}"]),
)
_out = st.builds(
    lambda i, o: {"type": "function_call_output", "call_id": f"c{i}", "output": o},
    st.integers(0, 3),
    _text,
)
_said = st.builds(
    lambda t: {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": t}],
    },
    _text,
)
_reasoning = st.just(REASONING)
_other = st.just({"type": "web_search_call", "id": "ws", "status": "completed"})
_items = st.lists(st.one_of(_user, _call, _out, _said, _reasoning, _other), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(_items, st.one_of(st.none(), _text))
def test_any_conversation_goes_back_as_it_came(given_items: list[Any], instructions: Any) -> None:
    original = {"model": "m", "input": given_items}
    if instructions is not None:
        original["instructions"] = instructions
    kept = copy.deepcopy(original)
    chat = items.to_chat(original)
    assert items.to_responses(original, copy.deepcopy(chat)) is original
    # Rebuilt from the messages one by one, the items are the client's, in order.
    body = [m for m in chat["messages"] if m.get(items.SOURCE) != items.INSTRUCTIONS]
    assert [i for m in body for i in items.message_items(m)] == given_items
    assert original == kept  # nothing was changed in place


def responses_body(steps: int, instructions: str = "You are helpful.") -> bytes:
    """A Responses request of an agent after ``steps`` tool rounds, as JSON bytes, with
    enough history for the body cache to keep it."""
    given: list[Any] = [{"role": "user", "content": "Weather in Paris? " + "x" * 400}]
    for n in range(steps):
        call = {**CALL, "id": f"fc_{n}", "call_id": f"call_{n}"}
        output = {**OUTPUT, "call_id": f"call_{n}", "output": f"Sunny, {n} C " + "y" * 600}
        given += [{**REASONING, "id": f"rs_{n}"}, call, output]
    body = {"model": "m", "instructions": instructions, "input": given, "tools": [TOOL]}
    return json.dumps(body).encode()


def test_a_continued_body_s_messages_are_the_objects_made_for_the_previous_step() -> None:
    """The body cache hands a step's items over as the previous step's objects; made into
    chat messages again they are the same messages, so the session's chains carry over
    them (proxy.transcript.Memo.chain) and the messages equal those made afresh."""
    cache = bodies.BodyCache(1 << 20, min_body=0, array=bodies.INPUT)
    previous: list[Any] = []
    known = None
    for steps in range(1, 40):
        parsed = cache.parse(responses_body(steps))
        assert parsed.known is not None
        chat = items.to_chat(parsed.payload, parsed.known.converted)
        messages = chat["messages"]
        assert messages == items.to_chat(json.loads(responses_body(steps)))["messages"]
        if steps > 1:
            assert parsed.reused
            shared = len(previous)  # every earlier message: the new round follows them
            assert all(a is b for a, b in zip(messages[:shared], previous, strict=True))
            memo = Memo(None, parsed.known)
            keys = chain_keys(messages, None, memo)
            assert keys == chain_keys(messages)
            assert memo._carried == shared  # the earlier links taken as they were
        else:
            chain_keys(messages, None, Memo(None, parsed.known))
        previous, known = messages, parsed.known
    assert known is not None and len(known.converted) <= 3 * 40 + 2  # only what is present


def test_edited_instructions_are_made_again() -> None:
    made: items.Converted = {}
    first = items.to_chat(json.loads(responses_body(2)), made)["messages"]
    again = json.loads(responses_body(2, instructions="You are terse."))
    second = items.to_chat(again, made)["messages"]
    assert second[0]["content"] == "You are terse." and first[0]["content"] != "You are terse."
    assert second == items.to_chat(again)["messages"]
