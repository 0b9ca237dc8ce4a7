"""Messages and tools as vLLM hands them to the chat template (pure, no I/O).

vLLM does not render the request's JSON as sent; it first normalises it
(``vllm/renderers/chat_utils.py``, ``entrypoints/openai/chat_completion/protocol.py``):

- content: a string stays; ``null`` becomes ""; a list of parts becomes its text parts
  joined by "\\n" (for templates that take string content, as ChatML ones do);
- only known keys survive: role, content, name; an assistant's tool_calls (an empty list
  is dropped) and reasoning (also as reasoning_content); a tool message's tool_call_id;
- tool-call ``arguments`` strings are parsed into objects (invalid JSON or a non-object
  becomes {}), so the template re-serializes them with ``tojson``;
- each tool is re-built from vLLM's model: ``{"type": "function", "function": {"name",
  "description", "parameters"[, "strict"]}}`` in that key order, with ``null`` for a
  missing description or parameters, and unknown keys dropped.

The same normalisation gives the simulator the same prompt text as vLLM for the same
request, which is what makes their token counts and cache hits comparable.
"""

from __future__ import annotations

import copy
import json
from typing import Any


class InvalidConversation(ValueError):
    """The request's messages or tools cannot be rendered (a 400 for the client)."""


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text":
                texts.append(str(part.get("text", "")))
        return "\n".join(texts)
    raise InvalidConversation("message content must be a string, a list of parts or null")


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if not raw:
        return {}
    try:
        parsed = json.loads(raw) if isinstance(raw, str | bytes) else raw
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _tool_calls(calls: Any) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise InvalidConversation("tool_calls must be a list")
    result = []
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise InvalidConversation("assistant tool_calls entries must be objects.")
        if call.get("type", "function") != "function":
            raise InvalidConversation(
                "chat completions only support assistant tool_calls of type 'function'."
            )
        call = copy.deepcopy(call)
        call["function"]["arguments"] = _arguments(call["function"].get("arguments"))
        result.append(call)
    return result


def normalize_message(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise InvalidConversation("each message must be an object with a string role")
    role = message["role"]
    result: dict[str, Any] = {"role": role, "content": _text(message.get("content"))}
    if isinstance(message.get("name"), str):
        result["name"] = message["name"]
    if role == "assistant":
        if message.get("tool_calls") is not None:
            calls = _tool_calls(message["tool_calls"])
            if calls:
                result["tool_calls"] = calls
        if message.get("reasoning") is not None:
            result["reasoning"] = result["reasoning_content"] = message["reasoning"]
    elif role == "tool" and "tool_call_id" in message:
        result["tool_call_id"] = message["tool_call_id"]
    return result


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list):
        raise InvalidConversation("messages must be a list")
    return [normalize_message(message) for message in messages]


def normalize_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise InvalidConversation("tools must be a list")
    result = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidConversation("each tool must have a function with a string name")
        spec = {
            "name": function["name"],
            "description": function.get("description"),
            "parameters": function.get("parameters"),
        }
        if function.get("strict") is not None:
            spec["strict"] = function["strict"]
        result.append({"type": "function", "function": spec})
    return result
