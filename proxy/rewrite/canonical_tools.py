"""Tools in a canonical form: one order and one serialization, whatever the client built.

Clients that gather tools from a set, a dict or MCP servers send the same tools in another
order from one request to the next, and the chat template renders them near the top of
the prompt: one moved tool breaks the prefix cache for everything after it.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from proxy import jsonio, tool_forms
from proxy.rewrite.pipeline import Request, RewriteContext, transform


class _Malformed(Exception):
    pass


@transform("canonical_tools")
def canonical_tools(request: Request, context: RewriteContext) -> Request | None:
    """The request with its tools sorted by function name and each tool's object keys
    sorted, or None when they already are (or when ``tools`` is not a list of objects:
    the engine judges malformed input, not the proxy)."""
    tools = request.get("tools")
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        return None
    # The plain encoding, kept with the list (by identity: a session's next steps bring the
    # same object, proxy.bodies), so the same bytes object keys the cache below.
    encoded = tool_forms.forms(tools).encoded
    ordered = None if encoded is None else _canonical_tools(encoded)
    return None if ordered is None else {**request, "tools": ordered}


@functools.lru_cache(maxsize=64)
def _canonical_tools(raw: bytes) -> list[dict[str, Any]] | None:
    """The canonical tool list for a serialized one, None if it is canonical already or
    malformed. Cached: an agent sends the same tools (in the same or another order) on
    every step. Callers never mutate requests, so sharing the result is safe. (A bytes
    object keeps its hash: a lookup by the object tool_forms keeps costs no hashing.)"""
    tools = json.loads(raw)  # exact (orjson would turn integers beyond 64 bits into floats)
    try:
        keyed = [(_sort_key(canonical), canonical) for canonical in map(_canonical, tools)]
    except _Malformed:
        return None
    ordered = [canonical for _, canonical in sorted(keyed, key=lambda pair: pair[0])]
    return None if jsonio.dumps(ordered) == raw else ordered


def _canonical(value: Any, *, keep_order: bool = False) -> Any:
    """A copy of ``value`` with object keys sorted at every depth; lists keep their order
    (``required`` and ``enum`` orders are the schema author's).

    The names under a JSON schema's ``properties`` keep the client's order: a chat template
    renders them in that order and vLLM's structured outputs (xgrammar) make the model
    generate arguments in that order, so sorting them could change what the model writes
    (e.g. a ``reasoning`` field placed before ``answer`` on purpose). Real clients build a
    schema from a declaration (pydantic, zod, a function signature): its order is stable.
    """
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            raise _Malformed
        keys = list(value) if keep_order else sorted(value)
        return {
            key: _canonical(
                value[key], keep_order=key == "properties" and isinstance(value[key], dict)
            )
            for key in keys
        }
    if isinstance(value, list):
        return [_canonical(item) for item in value]
    return value


def _sort_key(tool: dict[str, Any]) -> tuple[int, str, str]:
    """Function tools by name first; anything else after them. Ties (and tools without a
    name) by canonical JSON, so the order never depends on the order the client sent."""
    function = tool.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    serialized = json.dumps(tool, ensure_ascii=False, separators=(",", ":"))
    if tool.get("type") == "function" and isinstance(name, str):
        return (0, name, serialized)
    return (1, "", serialized)
