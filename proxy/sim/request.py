"""A chat completion request, read and checked the way vLLM checks it (pure)."""

from __future__ import annotations

import dataclasses
from typing import Any

from proxy.sim.reply import REPLAY_FIELD, InvalidReply, Reply, parse_reply


class RequestError(Exception):
    """A request the server refuses, with vLLM's status, message, type and param."""

    def __init__(self, status: int, message: str, kind: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param


def bad_request(message: str, param: str | None = None) -> RequestError:
    return RequestError(400, message, "BadRequestError", param)


def invalid_field(field: str, message: str) -> RequestError:
    # vLLM answers schema errors from its pydantic model with type "Bad Request".
    return RequestError(400, f"1 validation error:\n  {message}", "Bad Request", f"body.{field}")


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    messages: list[Any]
    stream: bool
    include_usage: bool
    continuous_usage: bool
    max_tokens: int | None
    ignore_eos: bool
    reply: Reply | None
    cache_salt: str


def check_model(payload: dict[str, Any], served: str) -> None:
    model = payload.get("model")
    if model is not None and model != served:
        raise RequestError(
            404,
            f"The model `{model}` does not exist. Valid aliases: {served}.",
            "NotFoundError",
            "model",
        )


def _max_tokens(payload: dict[str, Any], max_model_len: int) -> int | None:
    value = payload.get("max_completion_tokens")
    if value is None:
        value = payload.get("max_tokens")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise invalid_field("max_tokens", "max_tokens must be an integer")
    if value < 1:
        raise bad_request(
            f"max_tokens must be at least 1, got {value}. (parameter=max_tokens, value={value})",
            "max_tokens",
        )
    if value > max_model_len:
        raise bad_request(
            f"max_tokens={value} cannot be greater than max_model_len={max_model_len}. "
            f"Please request fewer output tokens. (parameter=max_tokens, value={value})",
            "max_tokens",
        )
    return value


def _cache_salt(payload: dict[str, Any]) -> str:
    salt = payload.get("cache_salt")
    if salt is None:
        return ""
    if not isinstance(salt, str) or not salt:
        raise invalid_field(
            "cache_salt",
            "cache_salt: Parameter 'cache_salt' must be a non-empty string if provided.",
        )
    return salt


def parse_chat(payload: Any, served: str, max_model_len: int) -> ChatRequest:
    """What the chat route needs besides the prompt (rendered from the same payload).
    Unknown fields are ignored, as vLLM does."""
    if not isinstance(payload, dict):
        raise invalid_field("", "the request body must be a JSON object")
    check_model(payload, served)
    messages = payload.get("messages")
    if messages is None:
        raise invalid_field("messages", "messages: Field required")
    if not isinstance(messages, list):
        raise invalid_field("messages", "messages: Input should be a valid list")
    options = payload.get("stream_options")
    options = options if isinstance(options, dict) else {}
    try:
        reply = parse_reply(payload[REPLAY_FIELD]) if payload.get(REPLAY_FIELD) else None
    except InvalidReply as exc:
        raise invalid_field(REPLAY_FIELD, str(exc)) from exc
    stream = bool(payload.get("stream", False))
    return ChatRequest(
        messages=messages,
        stream=stream,
        include_usage=stream and bool(options.get("include_usage", False)),
        continuous_usage=stream and bool(options.get("continuous_usage_stats", False)),
        max_tokens=_max_tokens(payload, max_model_len),
        ignore_eos=bool(payload.get("ignore_eos", False)),
        reply=reply,
        cache_salt=_cache_salt(payload),
    )


def output_limit(
    request: ChatRequest | CompletionRequest, prompt_tokens: int, max_model_len: int
) -> int:
    """vLLM's effective max_tokens: what is asked, within what the context leaves."""
    if prompt_tokens > max_model_len:
        count = max_model_len + 1  # vLLM truncates to max+1 tokens before checking
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt contains at least {count} input tokens, which exceeds this limit even "
            "without any output tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={count})",
            "input_tokens",
        )
    room = max_model_len - prompt_tokens
    limit = room if request.max_tokens is None else min(request.max_tokens, room)
    if limit < 1:
        raise bad_request(
            f"max_tokens must be at least 1, got {limit}. (parameter=max_tokens, value={limit})",
            "max_tokens",
        )
    return limit


# vLLM's CompletionRequest default (protocol.py): a completion without max_tokens gets 16.
COMPLETION_DEFAULT_MAX_TOKENS = 16


@dataclasses.dataclass(frozen=True)
class CompletionRequest:
    """A /v1/completions request: one prompt, as text or as token ids (no streaming)."""

    prompt: str | list[int]
    max_tokens: int
    cache_salt: str
    add_special_tokens: bool


def parse_completion(payload: Any, served: str, max_model_len: int) -> CompletionRequest:
    """What the completions route needs; refuses what the simulator does not model (batched
    prompts, streaming) with a 400 that says so."""
    if not isinstance(payload, dict):
        raise invalid_field("", "the request body must be a JSON object")
    check_model(payload, served)
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise bad_request("the simulator takes one prompt: a string or a list of token ids")
    elif not isinstance(prompt, str) or not prompt:
        raise invalid_field("prompt", "prompt: Field required")
    if payload.get("stream"):
        raise bad_request("the simulator does not stream /v1/completions")
    max_tokens = _max_tokens(payload, max_model_len)
    return CompletionRequest(
        prompt=prompt,
        max_tokens=COMPLETION_DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        cache_salt=_cache_salt(payload),
        add_special_tokens=bool(payload.get("add_special_tokens", True)),
    )
