"""Fewer, wider agent steps: ask for parallel tool calls, optionally say so in the prompt.

Every round trip costs the engine a prefill of the new tail and a scheduling slot, and
costs the agent a network hop: three independent lookups made one per step cost three
steps. A ``false`` ``parallel_tool_calls`` makes vLLM drop every call after the first
(``maybe_filter_parallel_tool_calls`` in vLLM 0.32's ``entrypoints/serve/utils/
tool_calls_utils.py``). So where tools are offered and the client did not choose, the
proxy sends ``true`` explicitly: vLLM 0.32 already treats unset as true, but a gateway or
engine in between may default otherwise. An explicit value is the client's decision and
is kept. The field changes how the reply is parsed, never the rendered prompt, so it
costs no prefix.

Optionally (off by default, it changes what the model reads) a constant instruction is
appended to the system prompt. It is one fixed text, appended the same way on every
request, so the prompt prefix stays byte-stable from step to step; it is not appended
when the system prompt already carries it (a client that sends the forwarded prompt
back). Without a system or developer message nothing is added: inventing one would
replace the chat template's default system prompt (Qwen's templates write their own when
there is none), and some templates accept no system role at all.
"""

from __future__ import annotations

from typing import Any

from proxy.rewrite.pipeline import Request, RewriteContext, Transform, transform

NAME = "batch_tool_calls"
INSTRUCTION = (
    "When several tool calls do not depend on each other's results, make them all at once "
    "in a single response instead of one per step."
)
SEPARATOR = "\n\n"
SYSTEM_ROLES = frozenset({"system", "developer"})


def tool_batching(*, parallel: bool = True, instruction: bool = False) -> Transform:
    """The ``batch_tool_calls`` transform with the given switches (settings
    ``parallel_tool_calls`` and ``batching_instruction``). It is always built, doing
    nothing when both are off, so ``disabled_rewrites`` can always name it."""

    @transform(NAME)
    def batch_tool_calls(request: Request, context: RewriteContext) -> Request | None:
        tools = request.get("tools")
        if not isinstance(tools, list) or not tools:
            return None
        changes: dict[str, Any] = {}
        if parallel and request.get("parallel_tool_calls") is None:  # null is unset too
            changes["parallel_tool_calls"] = True
        if instruction:
            messages = with_instruction(request.get("messages"))
            if messages is not None:
                changes["messages"] = messages
        return {**request, **changes} if changes else None

    return batch_tool_calls


def with_instruction(messages: Any) -> list[Any] | None:
    """``messages`` with INSTRUCTION appended to the first system or developer message,
    or None when there is none, it already carries the instruction, or its content is
    neither text nor a list of parts."""
    if not isinstance(messages, list):
        return None
    for index, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") in SYSTEM_ROLES:
            content = _appended(message.get("content"))
            if content is None:
                return None
            changed = list(messages)
            changed[index] = {**message, "content": content}
            return changed
    return None


def _appended(content: Any) -> str | list[Any] | None:
    if isinstance(content, str):
        if INSTRUCTION in content:
            return None
        return content + SEPARATOR + INSTRUCTION if content else INSTRUCTION
    if isinstance(content, list):
        texts = (_text(part) for part in content)
        if any(text is not None and INSTRUCTION in text for text in texts):
            return None
        # vLLM joins text parts with "\n" when it renders them as one string
        # (renderers/chat_utils.py), so the part needs no separator of its own.
        return [*content, {"type": "text", "text": INSTRUCTION}]
    return None


def _text(part: Any) -> str | None:
    if isinstance(part, dict) and part.get("type") == "text":
        text = part.get("text")
        return text if isinstance(text, str) else None
    return None
