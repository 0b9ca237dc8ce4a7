"""The summary request and the message it becomes (proxy.compaction.summarizer)."""

from __future__ import annotations

import json

import pytest

from proxy.compaction import summarizer

TURNS = [
    {"role": "user", "content": "Cancel reservation ZFA04Y please, user mia_li_3668."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {
                    "name": "get_reservation_details",
                    "arguments": '{"reservation_id": "ZFA04Y"}',
                },
            }
        ],
    },
    {
        "role": "tool",
        "tool_call_id": "c1",
        "content": '{"price": "$1,286.50", "date": "2024-05-21"}',
    },
]


def test_the_transcript_shows_calls_and_results() -> None:
    text = summarizer.transcript(TURNS)
    assert "USER:\nCancel reservation ZFA04Y" in text
    assert 'ASSISTANT CALLED get_reservation_details({"reservation_id": "ZFA04Y"})' in text
    assert "TOOL RESULT c1:" in text and "$1,286.50" in text


def test_the_request_extends_the_previous_summary() -> None:
    request = summarizer.summary_request("m", "Earlier: the user logged in.", TURNS, 200)
    assert request["max_tokens"] == 200 and request["temperature"] == 0
    assert request["messages"][0] == {"role": "system", "content": summarizer.INSTRUCTIONS}
    user = request["messages"][1]["content"]
    assert user.startswith("Summary so far:\nEarlier: the user logged in.")
    assert "ZFA04Y" in user
    assert "tools" not in request  # a summary must not call tools
    first = summarizer.summary_request("m", None, TURNS, 200)["messages"][1]["content"]
    assert not first.startswith("Summary so far")


def test_key_facts_keep_ids_amounts_and_dates_in_order() -> None:
    facts = summarizer.key_facts(TURNS)
    assert facts[:2] == ["ZFA04Y", "mia_li_3668"]
    assert "$1,286.50" in facts and "2024-05-21" in facts
    assert summarizer.key_facts(TURNS, previous=["OLD1"])[0] == "OLD1"
    many = [{"role": "user", "content": " ".join(f"ID{n:04d}" for n in range(200))}]
    assert len(summarizer.key_facts(many)) == summarizer.MAX_FACTS
    assert summarizer.key_facts(many)[-1] == "ID0199"  # the newest are kept


def test_summary_text_reads_a_chat_completion() -> None:
    body = {"choices": [{"message": {"role": "assistant", "content": "  The user wants X. "}}]}
    assert summarizer.summary_text(json.dumps(body).encode()) == "The user wants X."
    for bad in ({"choices": []}, {"choices": [{"message": {"content": "  "}}]}):
        with pytest.raises(ValueError):
            summarizer.summary_text(json.dumps(bad).encode())


def test_the_summary_message_is_a_user_message_with_its_facts() -> None:
    message = summarizer.summary_message("The user wants X.", ["ZFA04Y", "$10"])
    assert message["role"] == "user"
    assert message["content"].startswith(summarizer.SUMMARY_HEADER)
    assert message["content"].endswith(f"{summarizer.FACTS_HEADER} ZFA04Y, $10")


def test_the_in_context_request_is_the_conversation_plus_one_question() -> None:
    tools = [{"type": "function", "function": {"name": "get_reservation_details"}}]
    request = {
        "model": "m",
        "messages": TURNS,
        "tools": tools,
        "chat_template_kwargs": {"enable_thinking": False},
        "stream": True,
        "temperature": 0.7,
    }
    ask = summarizer.in_context_request(request, TURNS, 300)
    # The same rendered prefix (messages, tools, template arguments), one question more.
    assert ask["messages"][:-1] == TURNS and ask["tools"] == tools
    assert ask["chat_template_kwargs"] == {"enable_thinking": False}
    assert ask["messages"][-1] == {"role": "user", "content": summarizer.IN_CONTEXT_INSTRUCTIONS}
    assert ask["tool_choice"] == "none"
    assert (ask["max_tokens"], ask["temperature"], ask["stream"]) == (300, 0, False)
    assert "tool_choice" not in summarizer.in_context_request({"model": "m"}, TURNS, 300)


def test_key_facts_leave_json_keys_out_and_keep_whole_timestamps() -> None:
    record = '{"address1": "12 Oak St", "created_at": "2024-05-08T14:30:00", "user_id": "mia_3668"}'
    facts = summarizer.key_facts([{"role": "tool", "tool_call_id": "c", "content": record}])
    assert "address1" not in facts
    assert "2024-05-08T14:30:00" in facts and "mia_3668" in facts
