"""Chat templates rendered the way HF ``apply_chat_template`` does (and so vLLM).

The environment matches transformers' ``_compile_jinja_template``
(``utils/chat_template_utils.py``): an ``ImmutableSandboxedEnvironment`` with
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a ``tojson``
filter that is ``json.dumps(ensure_ascii=False)`` (not Jinja's HTML-escaping one), and the
globals ``raise_exception`` and ``strftime_now``. Templates get ``messages``, ``tools``,
``add_generation_prompt``, the tokenizer's special tokens (``bos_token``, ``eos_token``,
...) and any ``chat_template_kwargs``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from proxy.sim.chatml import CHATML_TOOLS_TEMPLATE
from proxy.sim.tokenizer import TokenizerError, read_tokenizer_config

TemplateError = jinja2.TemplateError


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def template_source(folder: str | Path | None) -> str:
    """The model folder's chat template (``chat_template.jinja``, else the one in
    ``tokenizer_config.json``), or the built-in ChatML one without a folder."""
    if folder is None or folder == "":
        return CHATML_TOOLS_TEMPLATE
    path = Path(folder).expanduser()
    standalone = path / "chat_template.jinja"
    if standalone.is_file():
        return standalone.read_text(encoding="utf-8")
    template = read_tokenizer_config(path).get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {item.get("name"): item.get("template") for item in template}
        template = named.get("default")
    if not isinstance(template, str):
        raise TokenizerError(f"{path} has no chat template")
    return template


class ChatRenderer:
    """One compiled template plus the tokenizer's variables; renders conversations."""

    def __init__(self, source: str, variables: Mapping[str, str]) -> None:
        self._template = compile_template(source)
        self._variables = dict(variables)

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        add_generation_prompt: bool,
        continue_final_message: bool = False,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        context = {**self._variables, **(extra or {})}
        text = self._template.render(
            messages=messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            **context,
        )
        if continue_final_message:
            text = _cut_after_final_message(text, messages)
        return text


def _cut_after_final_message(text: str, messages: list[dict[str, Any]]) -> str:
    """HF's continue_final_message: end the prompt right after the last message's
    content, so the model continues it instead of closing it."""
    final = messages[-1].get("content") or "" if messages else ""
    for candidate in (final, final.strip()):
        if candidate and candidate in text:
            return text[: text.rindex(candidate) + len(candidate)]
    raise jinja2.TemplateError(
        "continue_final_message is set but the final message does not appear in the rendered prompt"
    )
