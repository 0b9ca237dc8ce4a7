"""Reading OpenAI chat-completion stream chunks: which ones carry generated tokens."""

from __future__ import annotations

from typing import Any


def carries_token(choice: Any) -> bool:
    """Whether a chunk's choice carries generated output (content, a tool-call piece or
    reasoning); the role-only first chunk and the finish chunk do not."""
    delta = choice.get("delta") if isinstance(choice, dict) else None
    if not isinstance(delta, dict):
        return False
    return bool(
        delta.get("content")
        or delta.get("tool_calls")
        or delta.get("reasoning_content")
        or delta.get("reasoning")
    )


class ReplyAssembler:
    """Rebuilds the assistant message of a streamed reply from its chunks, exactly as
    emitted: content, reasoning and each tool call's argument string, concatenated.

    Bounded: past ``max_chars`` characters of text it lets go of what it kept
    (``too_long``), so an unending stream costs constant memory; such a reply is not
    recorded, and the next request is forwarded as the client sends it."""

    def __init__(self, max_chars: int | None = None) -> None:
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._arguments: dict[int, list[str]] = {}
        self._room = max_chars
        self.too_long = False

    def feed(self, payload: dict[str, Any]) -> None:
        choices = payload.get("choices")
        if not isinstance(choices, list) or self.too_long:
            return
        for choice in choices:
            delta = choice.get("delta") if isinstance(choice, dict) else None
            if not isinstance(delta, dict) or choice.get("index", 0) != 0:
                continue
            if isinstance(delta.get("content"), str):
                self._keep(self._content, delta["content"])
            if isinstance(delta.get("reasoning_content"), str):
                self._keep(self._reasoning, delta["reasoning_content"])
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict):
                    self._feed_call(call)

    def _keep(self, parts: list[str], text: str) -> None:
        if self._room is not None:
            self._room -= len(text)
            if self._room < 0:
                self.too_long = True
                self._content, self._reasoning, self._calls, self._arguments = [], [], {}, {}
                return
        parts.append(text)

    def _feed_call(self, call: dict[str, Any]) -> None:
        index = call.get("index", 0)
        known = self._calls.setdefault(index, {"type": "function", "function": {}})
        if call.get("id"):
            known["id"] = call["id"]
        if call.get("type"):
            known["type"] = call["type"]
        function = call.get("function")
        if not isinstance(function, dict):
            return
        if function.get("name"):
            known["function"]["name"] = function["name"]
        if isinstance(function.get("arguments"), str):
            self._keep(self._arguments.setdefault(index, []), function["arguments"])

    def message(self) -> dict[str, Any] | None:
        """The reply as emitted; None when it was too long to keep."""
        if self.too_long:
            return None
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._content)}
        if self._reasoning:
            message["reasoning_content"] = "".join(self._reasoning)
        if self._calls:
            message["tool_calls"] = [
                {
                    "id": call.get("id"),
                    "type": call["type"],
                    "function": {
                        "name": call["function"].get("name"),
                        "arguments": "".join(self._arguments.get(index, [])),
                    },
                }
                for index, call in sorted(self._calls.items())
            ]
        return message


def reply_message(body: Any) -> dict[str, Any] | None:
    """The assistant message of a non-streamed reply, as emitted."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    if not isinstance(message, dict):
        return None
    kept = {"role": "assistant", "content": message.get("content")}
    if message.get("reasoning_content"):
        kept["reasoning_content"] = message["reasoning_content"]
    if message.get("tool_calls"):
        kept["tool_calls"] = [
            {"id": c.get("id"), "type": c.get("type", "function"), "function": c.get("function")}
            for c in message["tool_calls"]
            if isinstance(c, dict)
        ]
    return kept
