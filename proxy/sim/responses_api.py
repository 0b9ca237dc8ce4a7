"""The simulator's /v1/responses bodies and events in vLLM 0.32's shape (pure: dicts and
bytes). The request is rendered as vLLM renders it: its items as chat messages
(proxy.responses.items follows vLLM's mapping); the answer is the chat answer written as
output items. Like vLLM without ``VLLM_ENABLE_RESPONSES_API_STORE``, nothing is stored:
``previous_response_id`` is answered 404."""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Iterator
from typing import Any

from proxy import jsonio
from proxy.responses import items
from proxy.sim.reply import REPLAY_FIELD

# Fields of a Responses request that map onto the chat request the simulator renders.
_CHAT_FIELDS = {"max_output_tokens": "max_tokens", "temperature": "temperature"}


def chat_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """The chat request vLLM renders for a Responses request (raises NotAConversation)."""
    chat = items.to_chat(payload)
    chat["messages"] = items.strip_sources(chat["messages"])
    for field, chat_field in _CHAT_FIELDS.items():
        if payload.get(field) is not None:
            chat[chat_field] = payload[field]
    for field in ("tool_choice", "cache_salt", "ignore_eos", REPLAY_FIELD):
        if field in payload:
            chat[field] = payload[field]
    return chat


def output_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat answer as the output items vLLM emits for it."""
    output: list[dict[str, Any]] = []
    if message.get("content"):
        output.append(_text_item(message["content"]))
    for call in message.get("tool_calls") or ():
        output.append(
            _call_item(call["id"], call["function"]["name"], call["function"]["arguments"])
        )
    return output


def _text_item(text: str) -> dict[str, Any]:
    return {
        "id": f"msg_{secrets.token_hex(8)}",
        "content": [{"annotations": [], "text": text, "type": "output_text", "logprobs": None}],
        "role": "assistant",
        "status": "completed",
        "type": "message",
    }


def _call_item(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "arguments": arguments,
        "call_id": call_id,
        "name": name,
        "type": "function_call",
        "id": f"fc_{secrets.token_hex(8)}",
        "status": "completed",
    }


def usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


@dataclasses.dataclass
class ResponseFormat:
    """One response: its body and, streamed, its events."""

    response_id: str
    created: int
    model: str
    request: dict[str, Any]
    sequence: int = 0

    def body(
        self, status: str, output: list[dict[str, Any]], used: dict[str, Any] | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.response_id,
            "created_at": self.created,
            "incomplete_details": {"reason": "max_output_tokens"}
            if status == "incomplete"
            else None,
            "instructions": self.request.get("instructions"),
            "model": self.model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": self.request.get("parallel_tool_calls", True),
            "tools": self.request.get("tools") or [],
            "status": status,
            "usage": used,
        }
        return body

    def event(self, kind: str, **fields: Any) -> bytes:
        payload = {**fields, "sequence_number": self.sequence, "type": kind}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + jsonio.dumps(payload) + b"\n\n"

    def opening(self) -> Iterator[bytes]:
        yield self.event("response.created", response=self.body("in_progress", [], None))
        yield self.event("response.in_progress", response=self.body("in_progress", [], None))


class StreamedOutput:
    """Turns the chat deltas of each generated token into Responses events."""

    def __init__(self, fmt: ResponseFormat) -> None:
        self._fmt = fmt
        self._text: dict[str, Any] | None = None
        self._texts: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._arguments: dict[int, list[str]] = {}
        self._order: list[Any] = []  # "text", or a call's index, in the order they began

    def deltas(self, deltas: list[dict[str, Any]]) -> Iterator[bytes]:
        fmt = self._fmt
        for delta in deltas:
            if delta.get("content"):
                if self._text is None:
                    self._text = _text_item("")
                    self._order.append("text")
                    item = {**self._text, "content": [], "status": "in_progress"}
                    yield fmt.event(
                        "response.output_item.added", item=item, output_index=self._index("text")
                    )
                    part = {"annotations": [], "text": "", "type": "output_text"}
                    yield fmt.event(
                        "response.content_part.added",
                        content_index=0,
                        item_id=self._text["id"],
                        output_index=self._index("text"),
                        part=part,
                    )
                self._texts.append(delta["content"])
                yield fmt.event(
                    "response.output_text.delta",
                    content_index=0,
                    delta=delta["content"],
                    item_id=self._text["id"],
                    logprobs=[],
                    output_index=self._index("text"),
                )
            for call in delta.get("tool_calls") or ():
                yield from self._call(call)

    def _index(self, key: Any) -> int:
        return self._order.index(key)

    def _call(self, call: dict[str, Any]) -> Iterator[bytes]:
        fmt, index = self._fmt, call["index"]
        function = call.get("function") or {}
        if index not in self._calls:
            self._calls[index] = _call_item(call.get("id", ""), function.get("name", ""), "")
            self._order.append(index)
            item = {**self._calls[index], "status": "in_progress"}
            yield fmt.event(
                "response.output_item.added", item=item, output_index=self._index(index)
            )
        if function.get("arguments"):
            self._arguments.setdefault(index, []).append(function["arguments"])
            yield fmt.event(
                "response.function_call_arguments.delta",
                delta=function["arguments"],
                item_id=self._calls[index]["id"],
                output_index=self._index(index),
            )

    def closing(self, status: str, used: dict[str, Any]) -> Iterator[bytes]:
        fmt = self._fmt
        output = []
        for key in self._order:
            position = self._index(key)
            if key == "text":
                assert self._text is not None
                text = "".join(self._texts)
                item = {**self._text, "content": [{**self._text["content"][0], "text": text}]}
                yield fmt.event(
                    "response.output_text.done",
                    content_index=0,
                    item_id=item["id"],
                    logprobs=[],
                    output_index=position,
                    text=text,
                )
            else:
                arguments = "".join(self._arguments.get(key, []))
                item = {**self._calls[key], "arguments": arguments}
                yield fmt.event(
                    "response.function_call_arguments.done",
                    arguments=arguments,
                    item_id=item["id"],
                    output_index=position,
                )
            yield fmt.event("response.output_item.done", item=item, output_index=position)
            output.append(item)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        yield fmt.event(kind, response=fmt.body(status, output, used))


def new_response_id() -> str:
    return f"resp_{secrets.token_hex(8)}"
