"""openai-python: the tool loop written by hand, as most custom agents do."""

from __future__ import annotations

import json
from typing import Any

import openai

from tests.clients import weather


def run(base_url: str, model: str, *, stream: bool) -> str:
    """Force the tool call, run it, send its result back; return the final text."""
    client = openai.OpenAI(base_url=base_url, api_key=weather.API_KEY, max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": weather.PROMPT}]
    step = _step(client, model, messages, stream, tool_choice=weather.forced())
    messages.append(step)
    for call in step["tool_calls"]:
        arguments = json.loads(call["function"]["arguments"])
        result = weather.get_weather(**arguments)
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    return _step(client, model, messages, stream, tool_choice="none")["content"]


def _step(
    client: openai.OpenAI, model: str, messages: list, stream: bool, tool_choice: Any
) -> dict[str, Any]:
    """One request; the assistant message it produced, as a dict to send back."""
    request: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "tools": [weather.openai_tool()],
        "tool_choice": tool_choice,
        "max_tokens": weather.MAX_TOKENS,
        "temperature": 0.0,
    }
    if not stream:
        reply = client.chat.completions.create(**request)
        return reply.choices[0].message.model_dump(include={"role", "content", "tool_calls"})
    content, calls = "", dict[int, dict[str, Any]]()
    for chunk in client.chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(
                    delta.index,
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                call["id"] = delta.id or call["id"]
                if delta.function:
                    call["function"]["name"] += delta.function.name or ""
                    call["function"]["arguments"] += delta.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [calls[index] for index in sorted(calls)]
    return message


def run_on_responses(base_url: str, model: str, *, stream: bool) -> str:
    """The same loop on ``client.responses.create``: the output items go back as input
    with each call's arguments re-encoded (``json.dumps`` spacing, as a loop that parses
    and rebuilds them sends them)."""
    client = openai.OpenAI(base_url=base_url, api_key=weather.API_KEY, max_retries=0)
    items: list[Any] = [{"role": "user", "content": weather.PROMPT}]
    forced = {"type": "function", "name": weather.NAME}
    output = _respond(client, model, items, stream, tool_choice=forced).output
    for item in output:
        sent = item.model_dump(exclude_none=True)
        if item.type == "function_call":
            arguments = json.loads(item.arguments)
            sent["arguments"] = json.dumps(arguments)
            result = weather.get_weather(**arguments)
            items += [
                sent,
                {"type": "function_call_output", "call_id": item.call_id, "output": result},
            ]
        else:
            items.append(sent)
    return _respond(client, model, items, stream, tool_choice="none").output_text


def _respond(client: openai.OpenAI, model: str, items: list, stream: bool, tool_choice: Any) -> Any:
    """One response (the completed one, when streamed)."""
    tool = weather.openai_tool()["function"]
    request: dict[str, Any] = {
        "model": model,
        "input": items,
        "tools": [{"type": "function", **tool}],
        "tool_choice": tool_choice,
        "max_output_tokens": weather.MAX_TOKENS,
        "temperature": 0.0,
    }
    if not stream:
        return client.responses.create(**request)
    events = list(client.responses.create(**request, stream=True))
    return next(
        e.response for e in events if e.type in ("response.completed", "response.incomplete")
    )
