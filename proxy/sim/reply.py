"""What the simulator answers, and how the answer is cut into tokens and stream deltas.

Replay extension: a request may carry ``x_replay_reply``, an OpenAI assistant message
(``content`` and/or ``tool_calls`` with JSON-string ``arguments``). The simulator then
answers exactly that: the same content, the same tool-call ids, names and argument
strings, byte for byte. Without it, the answer is synthetic: English-looking words chosen
by a hash of the prompt (so the same prompt always gets the same answer), ``reply_tokens``
tokens long with the end-of-turn token. vLLM ignores unknown fields, so a replayer can send
the field to either server.

Tokens vs deltas: the token ids (what the engine computes and caches) come from the chat
template's rendering of the answer (see ``PromptBuilder.answer_tokens``); the stream's
deltas (what the client reads) are the content cut at token boundaries, then per tool
call a header (id, type, name) and the argument string cut the same way, as vLLM's Hermes
tool parser streams them. Deltas are spread one per token from the start; the last token
(end of turn) carries the finish. ``max_tokens`` cuts both, with finish "length".
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import secrets
from collections.abc import Sequence
from typing import Any

from proxy.sim.tokenizer import Tokenizer

REPLAY_FIELD = "x_replay_reply"
_VOCABULARY = (
    "the result looks fine and we can continue with next step of plan while tool output is "
    "checked again for any missing detail before a short answer goes back to user who asked "
    "about their order booking account request status today"
)
_WORDS = tuple(_VOCABULARY.split())


class InvalidReply(ValueError):
    """``x_replay_reply`` is not an assistant message."""


@dataclasses.dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str


@dataclasses.dataclass(frozen=True)
class Reply:
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()

    def message(self) -> dict[str, Any]:
        """As an OpenAI assistant message (what the template renders)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in self.tool_calls
            ]
        return message


def tool_call_id() -> str:
    return f"chatcmpl-tool-{secrets.token_hex(8)}"


def parse_reply(value: Any) -> Reply:
    if not isinstance(value, dict):
        raise InvalidReply(f"{REPLAY_FIELD} must be an assistant message object")
    content = value.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if content is not None and not isinstance(content, str):
        raise InvalidReply(f"{REPLAY_FIELD}.content must be a string or null")
    calls = []
    for call in value.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidReply(f"{REPLAY_FIELD}.tool_calls entries need function.name")
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        calls.append(ToolCall(str(call.get("id") or tool_call_id()), function["name"], arguments))
    return Reply(content, tuple(calls))


def synthetic_tokens(prompt: Sequence[int], tokenizer: Tokenizer, length: int) -> list[int]:
    """Exactly ``length`` tokens of deterministic words, chosen by a hash of the prompt."""
    if length < 1:
        return []
    rng = random.Random(hashlib.sha256(repr(list(prompt)).encode()).digest())
    words = [rng.choice(_WORDS) for _ in range(length)]  # each word is at least one token
    words[0] = words[0].capitalize()
    return tokenizer.encode(" ".join(words))[:length]


@dataclasses.dataclass(frozen=True)
class Plan:
    tokens: list[int]
    deltas: list[list[dict[str, Any]]]  # per token: the deltas streamed when it is produced
    finish_reason: str  # "stop", "tool_calls" or "length"

    @property
    def engine_finish_reason(self) -> str:
        return "length" if self.finish_reason == "length" else "stop"

    def message(self) -> dict[str, Any]:
        """The answer as a complete message (non-streamed), from the same deltas."""
        content: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        for delta in (d for per_token in self.deltas for d in per_token):
            if delta.get("content"):
                content.append(delta["content"])
            for call in delta.get("tool_calls") or ():
                entry = calls.setdefault(call["index"], {"id": "", "name": "", "arguments": []})
                entry["id"] = call.get("id", entry["id"])
                entry["name"] = call["function"].get("name", entry["name"])
                entry["arguments"].append(call["function"].get("arguments", ""))
        message: dict[str, Any] = {"content": "".join(content) or (None if calls else "")}
        if calls:
            message["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": "".join(c["arguments"])},
                }
                for c in calls.values()
            ]
        return message


def reply_deltas(reply: Reply, tokenizer: Tokenizer) -> list[dict[str, Any]]:
    deltas: list[dict[str, Any]] = [{"content": p} for p in tokenizer.pieces(reply.content or "")]
    for index, call in enumerate(reply.tool_calls):
        header = {
            "id": call.id,
            "type": "function",
            "index": index,
            "function": {"name": call.name},
        }
        deltas.append({"content": None, "tool_calls": [header]})
        for piece in tokenizer.pieces(call.arguments):
            deltas.append(
                {
                    "content": None,
                    "tool_calls": [{"index": index, "function": {"arguments": piece}}],
                }
            )
    return deltas


def plan(reply: Reply, tokens: Sequence[int], tokenizer: Tokenizer, max_tokens: int) -> Plan:
    """Spread the reply's deltas over its tokens, then apply ``max_tokens``."""
    tokens = list(tokens)
    if not tokens:
        raise ValueError("an answer needs at least one token")
    deltas = reply_deltas(reply, tokenizer)
    per_token: list[list[dict[str, Any]]] = [[] for _ in tokens]
    slots = max(len(tokens) - 1, 1)  # the last token is the end of turn: it only finishes
    for index, delta in enumerate(deltas):
        slot = index if len(deltas) <= slots else index * slots // len(deltas)
        per_token[slot].append(delta)
    finish = "tool_calls" if reply.tool_calls else "stop"
    if len(tokens) > max_tokens:
        tokens, per_token, finish = tokens[:max_tokens], per_token[:max_tokens], "length"
    return Plan(tokens, per_token, finish)
