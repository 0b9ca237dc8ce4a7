"""litellm (the SDK, not its proxy): ``completion()`` with its vLLM provider, loop by hand."""

from __future__ import annotations

import json
import os
from typing import Any

from tests.clients import weather

# Read at import: no download of the model price list.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
import litellm

litellm.suppress_debug_info = True  # its "Provider List" banner on every model look-up


def run(base_url: str, model: str, *, stream: bool) -> str:
    messages: list[dict[str, Any]] = [{"role": "user", "content": weather.PROMPT}]
    step = _step(base_url, model, messages, stream, tool_choice=weather.forced())
    messages.append(step.model_dump(include={"role", "content", "tool_calls"}))
    for call in step.tool_calls:
        result = weather.get_weather(**json.loads(call.function.arguments))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return _step(base_url, model, messages, stream, tool_choice="none").content or ""


def _step(base_url: str, model: str, messages: list, stream: bool, tool_choice: Any) -> Any:
    """One request; the assistant message it produced."""
    reply = litellm.completion(
        model="hosted_vllm/" + model,
        api_base=base_url,
        api_key=weather.API_KEY,
        messages=messages,
        tools=[weather.openai_tool()],
        tool_choice=tool_choice,
        max_tokens=weather.MAX_TOKENS,
        temperature=0.0,
        stream=stream,
        num_retries=0,
    )
    if stream:
        reply = litellm.stream_chunk_builder(list(reply), messages=messages)
    return reply.choices[0].message
