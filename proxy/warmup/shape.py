"""What a warm-up sends: the next step's known prefix as token ids, cut to full blocks
(pure: request bodies in, no I/O).

From measurements on vLLM 0.32 (CPU build, the test model's ChatML/Hermes template;
tests/e2e/test_warmup_vllm.py keeps checking them):

- ``POST /tokenize`` with the forwarded messages plus the reply as emitted,
  ``add_generation_prompt: false`` and ``continue_final_message: false`` (and the request's
  tools and template fields) renders exactly what the next request will start with: its
  2,728 tokens were the first 2,728 of the next request's 2,760 (which adds the tool
  result and the generation prompt). ``continue_final_message: true`` is not it: it cuts
  the prompt after the reply's content, before the re-rendered tool calls.
- The prompt is then sent as token ids to ``POST /v1/completions``, cut to the largest
  multiple of the block size plus one: vLLM caches full blocks only and always computes
  the last prompt token, so the partial last block would be computed and thrown away.
  Measured: a 2,721-token warm-up (block 32) found 2,688 cached, computed 33, and the next
  step then found 2,720 cached instead of the 2,688 it would have had. The reply's own
  decode blocks did not match: the model's tokens for a tool call are not the template's
  re-rendering of it (tojson arguments), which is why a warm-up pays even on an idle
  engine.
- ``max_tokens: 1`` (vLLM rejects 0); the request's ``cache_salt`` (the same tenant's
  blocks); ``priority`` only when configured (vLLM refuses it without
  ``--scheduling-policy priority``; 0.32's /v1/completions accepted it here, older ones
  do not).
- Where ``/tokenize`` or ``/v1/completions`` is missing (404), a chat completion with
  ``add_generation_prompt: false`` and ``max_tokens: 1`` warms the same blocks (measured:
  2,720 of 2,728 cached) at the cost of computing the partial last block.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy import jsonio
from proxy.responses.items import strip_sources

DEFAULT_BLOCK_SIZE = 16  # vLLM's default on GPUs
# Fields of a chat request that change how its messages render (vLLM's TokenizeChatRequest
# takes the same ones).
RENDER_FIELDS = ("tools", "chat_template", "chat_template_kwargs", "mm_processor_kwargs")


def warm_length(count: int, block_size: int) -> int:
    """How many of a prompt's ``count`` tokens to send: its full blocks plus one token (the
    one vLLM always computes); 0 when not even one block would be cached."""
    full = (count - 1) // block_size * block_size if count > 0 else 0
    return full + 1 if full > 0 else 0


def _common(request: dict[str, Any]) -> dict[str, Any]:
    return {"model": request.get("model")} | {
        field: request[field] for field in RENDER_FIELDS if request.get(field) is not None
    }


def _extra(request: dict[str, Any], priority: int) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if request.get("cache_salt") is not None:
        extra["cache_salt"] = request["cache_salt"]
    if priority:
        extra["priority"] = priority
    return extra


def tokenize_body(request: dict[str, Any], messages: Sequence[Any]) -> dict[str, Any]:
    """The /tokenize request for the rendered conversation, without a generation prompt."""
    return _common(request) | {
        "messages": strip_sources(messages),
        "add_generation_prompt": False,
        "continue_final_message": False,
    }


def completion_body(request: dict[str, Any], tokens: Sequence[int], priority: int) -> dict:
    return {"model": request.get("model"), "prompt": list(tokens), "max_tokens": 1} | _extra(
        request, priority
    )


def chat_body(request: dict[str, Any], messages: Sequence[Any], priority: int) -> dict:
    """The fallback: a chat completion of the same prompt, one token long."""
    return (
        _common(request)
        | {"messages": strip_sources(messages), "add_generation_prompt": False, "max_tokens": 1}
        | {"stream": False}
        | _extra(request, priority)
    )


def route_missing(status: int, body: bytes) -> bool:
    """A 404/405 from the router (FastAPI's ``{"detail": ...}``), not an OpenAI error such
    as vLLM's 404 for an unknown model."""
    if status not in (404, 405):
        return False
    try:
        payload = jsonio.loads(body)
    except jsonio.InvalidJSON:
        return True
    return not (isinstance(payload, dict) and "error" in payload)
