"""The running summary: the request that asks a model for it, and the message it becomes.

The summary is written by the upstream model itself, asked at the end of the conversation
as the engine has it cached (``in_context_request``: the engine reads only the question),
or by a configured summarizer engine from a plain-text transcript of the turns being
folded (``summary_request``: another engine has none of it cached). Either way it extends
the previous summary. Models, small ones above all, drop identifiers: so the proxy also
lists, deterministically, the ids, amounts and dates that appear in the folded turns
(``key_facts``) and appends them to the summary. Later steps can still quote a
reservation id the model left out of its prose.

The prompts (``IN_CONTEXT_INSTRUCTIONS``, ``INSTRUCTIONS``) are part of the product: they
are documented in the README, and changing them changes every summary.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

from proxy import jsonio
from proxy.errors import UpstreamError
from proxy.responses.items import strip_sources
from proxy.upstream import RawHeaders, Upstream

INSTRUCTIONS = (
    "You compress the history of an AI agent's conversation so the agent can carry on its "
    "task after the older turns are removed. Write a concise summary in plain sentences, "
    "in the past tense, of: what the user asked for; what the agent found out from tool "
    "results (keep every id, name, number, amount and date exactly as written); what was "
    "decided or done, and what the user confirmed or refused; what is still open. Do not "
    "invent anything and do not address the user."
)
SUMMARY_HEADER = "[Summary of the earlier part of this conversation, written to fit the context]"
FACTS_HEADER = "Ids, amounts and dates from the summarized turns:"
# Room for the transcript's framing words; the transcript itself is bounded by what the
# compactor folds (well under the context).
MAX_FACTS = 64
# Tokens that carry facts: with a digit in them (ids, amounts, dates, phone numbers) or an
# e-mail address. Whole words only, trailing punctuation left out.
_FACT = re.compile(
    r"(?:[\w.+-]+@[\w-]+\.[\w.-]+"  # e-mail
    r"|[$€£]\s?\d[\d,]*(?:\.\d+)?"  # money
    r"|\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?)?\b"  # ISO date and time
    r"|#?\b(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[\w-]{4,}\b"  # ids mixing letters and digits
    r"|\b\d[\d,]*\.\d+\b|\b\d{3,}\b)"  # numbers worth keeping
    r"(?!\"?\s*:)"  # but not a JSON key ("address1": ...)
)


def transcript(messages: Sequence[Any]) -> str:
    """The folded turns as plain text, one block per message."""
    blocks: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = str(message.get("role") or "unknown")
        text = _text(message.get("content"))
        if role == "tool":
            name = message.get("name") or message.get("tool_call_id") or ""
            blocks.append(f"TOOL RESULT {name}:\n{text}".rstrip())
            continue
        lines = [f"{role.upper()}:\n{text}".rstrip()] if text else []
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                args = function.get("arguments")
                args = args if isinstance(args, str) else jsonio.dumps(args).decode()
                lines.append(f"{role.upper()} CALLED {function.get('name')}({args})")
        blocks.extend(lines)
    return "\n\n".join(blocks)


def summary_request(
    model: str, previous: str | None, messages: Sequence[Any], max_tokens: int
) -> dict[str, Any]:
    """The chat request that asks for the new running summary."""
    parts = []
    if previous:
        parts.append(f"Summary so far:\n{previous}")
    parts.append(f"Conversation turns to add to the summary:\n\n{transcript(messages)}")
    parts.append("Write the updated summary now.")
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": "\n\n".join(parts)},
        ],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": False,
    }


# Asked at the end of the conversation itself (in_context_request).
IN_CONTEXT_INSTRUCTIONS = (
    "[Context compaction] Stop the task for a moment: the older part of this conversation "
    "will be removed to fit the context window. Write a summary of the conversation so far "
    "(including any earlier summary above) that lets you carry on the task without it: "
    "what the user asked for; what you found out from tool results (keep every id, name, "
    "number, amount and date exactly as written); what was decided or done, and what the "
    "user confirmed or refused; what is still open. Plain sentences, past tense. Do not "
    "call tools, do not answer the user, write only the summary."
)
# Request fields that shape the rendered prompt: kept so the prompt's prefix is the one
# the engine has cached.
_PROMPT_FIELDS = ("model", "tools", "chat_template_kwargs", "cache_salt", "documents")


def in_context_request(
    request: dict[str, Any], messages: Sequence[Any], max_tokens: int
) -> dict[str, Any]:
    """The summary request as the conversation itself plus one question at its end.

    ``messages`` are the forwarded messages up to the end of the part to fold: the engine
    has them cached (they are the prefix of the session's last prompt), so the summary
    costs the engine the question and the answer, not a re-read of the history. Tools
    stay in the request, so the rendered prefix stays the same, with tool_choice none."""
    ask = {field: request[field] for field in _PROMPT_FIELDS if field in request}
    question = {"role": "user", "content": IN_CONTEXT_INSTRUCTIONS}
    ask["messages"] = [*strip_sources(messages), question]
    if ask.get("tools"):
        ask["tool_choice"] = "none"
    ask.update(max_tokens=max_tokens, temperature=0, stream=False)
    return ask


def key_facts(messages: Sequence[Any], previous: Iterable[str] = ()) -> list[str]:
    """Ids, amounts and dates from the messages, in order of first appearance, after the
    ones already kept (``previous``); at most MAX_FACTS, the newest kept."""
    seen = dict.fromkeys(previous)
    for message in messages:
        if not isinstance(message, dict):
            continue
        texts = [_text(message.get("content"))]
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                texts.append(str(function.get("arguments") or ""))
        for text in texts:
            for match in _FACT.finditer(text):
                seen.setdefault(match.group(0).rstrip(".,"), None)
    facts = list(seen)
    return facts[-MAX_FACTS:]


def summary_text(reply: bytes) -> str:
    """The summary in a chat completion body; raises ValueError if there is none."""
    payload = jsonio.loads(reply)
    try:
        content = payload["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError("the summarizer's reply has no message content") from exc
    if not isinstance(content, str) or not content.strip():
        raise ValueError("the summarizer's reply is empty")
    return content.strip()


def summary_message(text: str, facts: Sequence[str], *, header: bool = True) -> dict[str, Any]:
    """The message that stands in for the folded turns, right after the pinned head. A
    user message: every chat template accepts one there, unlike a second system message.
    ``header``: say it is a summary (not for the fallback's marker)."""
    body = f"{SUMMARY_HEADER}\n{text}" if header else text
    if facts:
        body += f"\n\n{FACTS_HEADER} {', '.join(facts)}"
    return {"role": "user", "content": body}


async def summarize(
    upstream: Upstream,
    request: dict[str, Any],
    *,
    credentials: RawHeaders = (),
    timeout: float | None = None,
    base: str = "",
) -> str:
    """Ask the summarizer (engine ``base``, default its first); the summary text, or
    UpstreamError / ValueError."""
    status, body = await upstream.call(
        "/v1/chat/completions", request, headers=credentials, timeout=timeout, base=base
    )
    if status != 200:
        detail = body[:300].decode(errors="replace")
        raise UpstreamError(f"summarizer {upstream.base_url} answered {status}: {detail}")
    return summary_text(body)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):
        return " ".join(
            part["text"].strip()
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""
