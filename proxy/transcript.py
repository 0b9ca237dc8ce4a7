"""Keys for the messages of a conversation: what the client sent, up to changes of form.

A message's *key* ignores what frameworks change when they send history back without
changing its meaning (tool-call arguments re-serialized, ``null`` vs ``""`` content,
surrounding whitespace, a dropped reasoning field, the volatile values of a system
prompt). Keys are chained, as vLLM chains block hashes: message i's key covers messages
0..i, so an equal key means an equal conversation so far. No I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from proxy import jsonio

Mask = Callable[[str], str]

_ROOT = b"prefill-proxy/transcript/v1"


def _text(content: Any) -> Any:
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):  # content parts: text parts by their text, others as is
        return [
            part["text"].strip()
            if isinstance(part, dict)
            and part.get("type") == "text"
            and isinstance(part.get("text"), str)
            else part
            for part in content
        ]
    return content


def _arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments.strip()
    return arguments


def _tool_calls(calls: Any) -> Any:
    if not isinstance(calls, list):
        return calls
    normal = []
    for call in calls:
        if not isinstance(call, dict):
            normal.append(call)
            continue
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        normal.append([call.get("id"), function.get("name"), _arguments(function.get("arguments"))])
    return normal


def normal_form(message: Any, mask: Mask | None = None) -> Any:
    """What identifies a message, with the form changes of agent frameworks taken out."""
    if not isinstance(message, dict):
        return ["?", message]
    role = message.get("role")
    content = _text(message.get("content"))
    if mask is not None and role in ("system", "developer") and isinstance(content, str):
        content = mask(content)
    form = [role, content, message.get("name"), message.get("tool_call_id")]
    if message.get("tool_calls"):
        form.append(_tool_calls(message["tool_calls"]))
    return form


def _digest(previous: bytes, form: Any) -> bytes:
    return hashlib.blake2b(previous + jsonio.dumps_canonical(form), digest_size=16).digest()


def chain_keys(messages: Sequence[Any], mask: Mask | None = None) -> list[bytes]:
    """Key i identifies messages[0..i] up to form changes."""
    keys: list[bytes] = []
    previous = _ROOT
    for message in messages:
        previous = _digest(previous, normal_form(message, mask))
        keys.append(previous)
    return keys


def next_key(previous: bytes | None, message: Any, mask: Mask | None = None) -> bytes:
    """The key a message appended after ``previous`` will have."""
    return _digest(previous or _ROOT, normal_form(message, mask))


def exact_chain(messages: Sequence[Any]) -> list[bytes]:
    """Hashes of the exact values: message i's covers messages 0..i (prefix comparison).
    Key order is left out: chat templates read fields by name, so it never reaches the
    prompt (clients re-order keys freely, e.g. pydantic's model_dump)."""
    hashes: list[bytes] = []
    previous = _ROOT
    for message in messages:
        encoded = jsonio.dumps_canonical(message)
        previous = hashlib.blake2b(previous + encoded, digest_size=16).digest()
        hashes.append(previous)
    return hashes
