"""Response bodies and SSE events in vLLM 0.32's exact shape (pure: dicts and bytes).

Byte-level details copied from real vLLM streams (compact JSON, key order):
- the first chunk carries ``{"role": "assistant", "content": ""}`` and
  ``prompt_token_ids``/``prompt_text`` nulls; later chunks carry ``token_ids: null``;
- the terminal chunk has ``finish_reason`` and ``stop_reason``; ``system_fingerprint``
  goes on it only when usage was not asked for, else on the usage-only chunk
  (``"choices": []``) that follows;
- ``stream_options.continuous_usage_stats`` adds a running ``usage`` to every chunk.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from proxy import jsonio

DONE = b"data: [DONE]\n\n"


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + jsonio.dumps(payload) + b"\n\n"


def error_body(message: str, kind: str, status: int, param: str | None = None) -> bytes:
    return jsonio.dumps(
        {"error": {"message": message, "type": kind, "param": param, "code": status}}
    )


@dataclasses.dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    created_cache_tokens: int

    def final(self, *, stream: bool) -> dict[str, Any]:
        details: dict[str, Any] = {
            "cached_tokens": self.cached_tokens,
            "created_cache_tokens": self.created_cache_tokens,
        }
        if not stream:
            details["multimodal_tokens"] = None
        usage: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "completion_tokens": self.completion_tokens,
            "prompt_tokens_details": details,
        }
        if not stream:
            usage["completion_tokens_details"] = None
        return usage


def running_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "completion_tokens_details": None,
    }


@dataclasses.dataclass(frozen=True)
class ChunkFormat:
    """The chunks of one streamed completion."""

    request_id: str
    created: int
    model: str
    fingerprint: str
    include_usage: bool
    continuous_usage: bool

    def _head(self) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
        }

    def role(self, usage: dict[str, Any] | None = None) -> bytes:
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        payload = {**self._head(), "choices": [choice]}
        if usage is not None and self.continuous_usage:
            payload["usage"] = usage
        payload["prompt_token_ids"] = None
        payload["prompt_text"] = None
        return event(payload)

    def delta(
        self,
        delta: dict[str, Any],
        *,
        finish_reason: str | None = None,
        usage: dict[str, Any] | None = None,
    ) -> bytes:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None}
        choice["finish_reason"] = finish_reason
        if finish_reason is not None:
            choice["stop_reason"] = None
        choice["token_ids"] = None
        payload = {**self._head(), "choices": [choice]}
        if usage is not None and self.continuous_usage:
            payload["usage"] = usage
        if finish_reason is not None and not self.include_usage:
            payload["system_fingerprint"] = self.fingerprint
        return event(payload)

    def usage(self, usage: Usage) -> bytes:
        payload = {**self._head(), "choices": [], "usage": usage.final(stream=True)}
        payload["system_fingerprint"] = self.fingerprint
        return event(payload)


def completion_body(
    *,
    request_id: str,
    created: int,
    model: str,
    fingerprint: str,
    message: dict[str, Any],
    finish_reason: str,
    usage: Usage,
) -> bytes:
    full_message: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    full_message |= {"refusal": None, "annotations": None, "audio": None, "function_call": None}
    if message.get("tool_calls"):
        full_message["tool_calls"] = message["tool_calls"]
    full_message["reasoning"] = None
    choice = {
        "index": 0,
        "message": full_message,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "token_ids": None,
        "routed_experts": None,
    }
    return jsonio.dumps(
        {
            "id": request_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": fingerprint,
            "usage": usage.final(stream=False),
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }
    )


def models_body(*, model: str, root: str, created: int, max_model_len: int) -> bytes:
    permission = {
        "id": f"modelperm-{model}",
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": root,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [permission],
    }
    return jsonio.dumps({"object": "list", "data": [card]})


def text_completion_body(
    *,
    request_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str,
    usage: Usage,
) -> bytes:
    """A non-streamed /v1/completions answer (vLLM's ``text_completion`` object)."""
    choice = {
        "index": 0,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": None,
        "token_ids": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
    }
    return jsonio.dumps(
        {
            "id": request_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage.final(stream=False),
            "kv_transfer_params": None,
        }
    )
