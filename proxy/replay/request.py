"""The body a client sends for one step: the profile's prompt, the agent's sampling
parameters, a stream with usage, and the recorded answer for engines that can replay it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.replay.profiles import Profile, Prompt
from proxy.replay.traces import Step
from proxy.responses import items

REPLY_FIELD = "x_replay_reply"
"""Extension field carrying the recorded assistant message. The simulator streams it back,
so a replay stays faithful; vLLM ignores unknown fields."""

# Fields the replay decides itself; meta.request cannot override them.
_OWN_FIELDS = frozenset({"model", "messages", "tools", "stream", "stream_options", REPLY_FIELD})


def sampling(request: Mapping[str, Any], *, has_tools: bool) -> dict[str, Any]:
    """The agent's recorded sampling parameters, as far as an engine should see them."""
    params: dict[str, Any] = {}
    for key, value in request.items():
        if key in _OWN_FIELDS or value is None:  # None: the agent left it unset
            continue
        if key == "parallel_tool_calls" and value is False:
            continue  # vLLM then drops every tool call after the first (vLLM source)
        if key == "tool_choice" and not has_tools:
            continue  # engines reject a tool choice without tools
        params[key] = value
    return params


def build(
    step: Step,
    profile: Profile,
    model: str,
    max_tokens: int | None = None,
    emitted: Mapping[int, dict[str, Any]] | None = None,
) -> dict:
    """The request body for ``step`` as the client in ``profile`` would send it; with
    ``emitted`` (trace position -> the reply the engine gave for it), the history carries
    those replies instead of the recorded ones, as an agent sends back what it got."""
    conversation = step.conversation
    history = step.messages
    if emitted:
        history = [emitted.get(k, message) for k, message in enumerate(history)]
    prompt = profile(Prompt(history, conversation.tools), conversation.id, step.index)
    body: dict[str, Any] = {"model": model, "messages": prompt.messages}
    if prompt.tools:
        body["tools"] = prompt.tools
    body.update(sampling(conversation.request, has_tools=bool(prompt.tools)))
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    body[REPLY_FIELD] = step.reply  # what the engine "emitted": always the recorded message
    return body


# Sampling fields the Responses API takes (under these names); others are chat-only.
_RESPONSES_SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "parallel_tool_calls": "parallel_tool_calls",
}


def as_responses(body: dict[str, Any]) -> dict[str, Any]:
    """A chat body (``build``'s) as the same client would send it to /v1/responses: the
    leading system message as ``instructions``, the rest as input items (a tool call as a
    ``function_call``, its result as a ``function_call_output``), tools flat."""
    messages = list(body["messages"])
    converted: dict[str, Any] = {"model": body["model"]}
    if (
        messages
        and messages[0].get("role") == "system"
        and isinstance(messages[0].get("content"), str)
    ):
        converted["instructions"] = messages.pop(0)["content"]
    converted["input"] = [item for message in messages for item in items.message_items(message)]
    if body.get("tools"):
        converted["tools"] = [items.responses_tool(tool) for tool in body["tools"]]
    for field, name in _RESPONSES_SAMPLING.items():
        if field in body:
            converted[name] = body[field]
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        choice = {"type": "function", "name": choice["function"].get("name")}
    if choice is not None:
        converted["tool_choice"] = choice
    converted["stream"] = body.get("stream", True)
    converted[REPLY_FIELD] = body.get(REPLY_FIELD)
    return converted
