"""Reading a Responses event stream (proxy.responses.events) and a replay of one
(proxy.replay.response, proxy.replay.request.as_responses)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from proxy.errors import UpstreamError
from proxy.exchange import Exchange
from proxy.replay.request import REPLY_FIELD, as_responses
from proxy.replay.response import StreamObserver
from proxy.responses import items
from proxy.responses.events import ResponsesStreamWatcher
from tests.support.fake_upstream import WORDS, responses_events


def stream() -> bytes:
    return b"".join(responses_events())


def test_every_byte_passes_however_it_is_cut() -> None:
    whole = stream()
    for size in (1, 7, 64, len(whole)):
        exchange = Exchange("/v1/responses", "POST")
        watcher = ResponsesStreamWatcher(exchange)
        out = b"".join(
            watcher.relay(whole[i : i + size], float(i)) for i in range(0, len(whole), size)
        )
        assert out + watcher.flush() == whole
        assert exchange.first_token_at is not None  # at the first output delta
        assert exchange.usage == {
            "prompt_tokens": 5,
            "completion_tokens": len(WORDS),
            "prompt_tokens_details": {"cached_tokens": 0},
        }


def test_the_reply_is_ready_before_the_terminal_event_is_relayed() -> None:
    exchange = Exchange("/v1/responses", "POST")
    delivered: list[Any] = []

    async def on_reply() -> None:
        delivered.append(exchange.reply)

    watcher = ResponsesStreamWatcher(exchange, on_reply=on_reply)
    *head, terminal = responses_events()
    watcher.relay(b"".join(head), 0.0)
    assert not watcher.reply_ready
    watcher.relay(terminal, 1.0)
    assert watcher.reply_ready and watcher.response_id == "resp_1"
    asyncio.run(watcher.deliver_reply())
    (reply,) = delivered
    assert reply["content"] == "".join(WORDS)
    assert reply[items.SOURCE][0]["id"] == "msg_1"  # the output item as emitted


def test_a_reply_past_the_limit_is_not_kept() -> None:
    exchange = Exchange("/v1/responses", "POST")

    async def on_reply() -> None:
        raise AssertionError("not for a reply too long to keep")

    watcher = ResponsesStreamWatcher(exchange, on_reply=on_reply, max_reply_chars=3)
    watcher.relay(stream(), 0.0)
    assert watcher.reply_too_long and not watcher.reply_ready and exchange.reply is None


def test_the_error_event_follows_the_last_number() -> None:
    watcher = ResponsesStreamWatcher(Exchange("/v1/responses", "POST"))
    watcher.relay(b"".join(responses_events()[:3]), 0.0)
    event = watcher.error_event(UpstreamError("the engine went away"))
    kind, data = event.split(b"\n", 1)
    assert kind == b"event: error" and event.endswith(b"\n\n")
    payload = json.loads(data.removeprefix(b"data: "))
    assert payload["type"] == "error" and payload["sequence_number"] == 3
    assert payload["message"] == "the engine went away"


def test_a_replayed_responses_stream_is_read_for_ttft_and_usage() -> None:
    observer = StreamObserver()
    for index, event in enumerate(responses_events()):
        observer.feed(event, float(index))
    observer.close(99.0)
    assert observer.first_token_at == 1.0  # the first delta, after response.created
    assert observer.usage is not None and observer.usage["prompt_tokens"] == 5
    assert observer.error is None


def test_a_chat_body_as_the_same_client_would_send_it_to_responses() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}}
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "done"},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "max_tokens": 16,
        "stream": True,
        "stream_options": {"include_usage": True},
        REPLY_FIELD: {"content": "ok"},
    }
    converted = as_responses(body)
    assert converted["instructions"] == "Be brief."
    assert converted["input"] == [
        {"type": "message", "role": "user", "content": "go"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a":1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "done"},
    ]
    assert converted["tools"] == [{"type": "function", "name": "f", "parameters": {}}]
    assert converted["tool_choice"] == {"type": "function", "name": "f"}
    assert converted["max_output_tokens"] == 16 and "stream_options" not in converted
    # Read back, it is the conversation the chat client sent.
    again = items.strip_sources(items.to_chat(converted)["messages"])
    assert [m["role"] for m in again] == ["system", "user", "assistant", "tool"]
    assert again[2]["tool_calls"] == [call]


def test_unknown_events_pass_untouched() -> None:
    unknown = b'event: response.vendor.thing\ndata: {"type":"response.vendor.thing","x":1}\n\n'
    comment = b": keep-alive\n\n"
    whole = unknown + comment + stream()
    exchange = Exchange("/v1/responses", "POST")
    watcher = ResponsesStreamWatcher(exchange)
    assert watcher.relay(whole, 0.0) + watcher.flush() == whole
    assert exchange.usage is not None and exchange.usage["prompt_tokens"] == 5
