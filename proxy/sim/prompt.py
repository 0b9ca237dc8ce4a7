"""From a chat request to token ids: normalise, render, encode (pure, no I/O).

Also the other direction the simulator needs: the tokens of an *answer*, taken from the
template's own rendering of the assistant message, so the blocks cached while decoding
are exactly the ones the next request (which re-renders that message) will look up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from proxy.sim.conversation import normalize_message, normalize_messages, normalize_tools
from proxy.sim.template import ChatRenderer
from proxy.sim.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class Prompt:
    text: str
    tokens: list[int]
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    variables: Mapping[str, Any]
    continued: bool  # continue_final_message: the answer extends the last message


class PromptBuilder:
    def __init__(self, renderer: ChatRenderer, tokenizer: Tokenizer) -> None:
        self.renderer = renderer
        self.tokenizer = tokenizer
        eos = tokenizer.encode(tokenizer.eos_token) if tokenizer.eos_token else []
        self._eos = eos[0] if len(eos) == 1 else None

    def chat(
        self,
        messages: Any,
        tools: Any = None,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        variables: Mapping[str, Any] | None = None,
    ) -> Prompt:
        """Raises InvalidConversation or TemplateError for what cannot be rendered."""
        normalized = normalize_messages(messages)
        tool_dicts = normalize_tools(tools)
        text = self.renderer.render(
            normalized,
            tool_dicts,
            add_generation_prompt=add_generation_prompt and not continue_final_message,
            continue_final_message=continue_final_message,
            extra=variables,
        )
        return Prompt(
            text,
            self.tokenizer.encode(text),
            normalized,
            tool_dicts,
            dict(variables or {}),
            continue_final_message,
        )

    def answer_tokens(self, prompt: Prompt, message: Mapping[str, Any]) -> list[int]:
        """The tokens a model emits for ``message`` after ``prompt``: the template's
        rendering of it, up to and including the end-of-turn token."""
        if not prompt.continued:
            full = self.renderer.render(
                [*prompt.messages, normalize_message(dict(message))],
                prompt.tools,
                add_generation_prompt=False,
                extra=prompt.variables,
            )
            if full.startswith(prompt.text) and len(full) > len(prompt.text):
                return self._until_eos(self._continuation(prompt.text, full[len(prompt.text) :]))
        # The template re-renders history (or the turn is continued): plain content + eos.
        tokens = self.tokenizer.encode(message.get("content") or "")
        return tokens + ([self._eos] if self._eos is not None else [])

    def _continuation(self, prefix: str, suffix: str) -> list[int]:
        """encode(prefix + suffix) minus encode(prefix), without encoding the whole prefix:
        special tokens split the text first, so only what follows the last one matters."""
        cut = max(
            (prefix.rfind(m) + len(m) for m in self.tokenizer.markers if m in prefix), default=0
        )
        tail = prefix[cut:]
        base = self.tokenizer.encode(tail) if tail else []
        joint = self.tokenizer.encode(tail + suffix)
        if joint[: len(base)] == base:
            return joint[len(base) :]
        return self.tokenizer.encode(suffix)  # BPE merged across the boundary: rare

    def _until_eos(self, tokens: list[int]) -> list[int]:
        """The model stops at its end-of-turn token; what the template adds after it
        (a newline) is the next prompt's, not the answer's."""
        if self._eos is not None and self._eos in tokens:
            end = len(tokens) - tokens[::-1].index(self._eos)
            return tokens[:end]
        return tokens or ([self._eos] if self._eos is not None else [])
