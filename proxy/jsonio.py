"""JSON in and out: orjson for speed, the standard library for what orjson refuses.

orjson rejects the NaN/Infinity literals that Python's json (and so many clients) accept,
and cannot write integers beyond 64 bits; such bodies must still pass, so they fall back.
Known limit: orjson reads an integer literal beyond 64 bits as a float, so a request the
proxy rewrites would carry it as a float (no OpenAI field takes such a number).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

# Deepest nesting read: orjson's own limit. A deeper body is refused (a 400 for a client's
# request), not handed to the standard library, whose recursion would fail further on.
MAX_DEPTH = 1024


class InvalidJSON(ValueError):
    pass


def loads(data: bytes | str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):
            raise InvalidJSON(f"nested deeper than {MAX_DEPTH} levels") from exc
        try:
            return json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError) as fallback:
            raise InvalidJSON(str(fallback)) from fallback


def dumps(value: Any) -> bytes:
    """Compact JSON; InvalidJSON for a value nested too deep to encode (orjson stops at
    255 levels, the standard library near Python's recursion limit)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return _fallback(value, separators=(",", ":"))


def dumps_canonical(value: Any) -> bytes:
    """Keys sorted: equal values give equal bytes (for hashing, not for sending)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return _fallback(value, sort_keys=True, default=str)


def _fallback(value: Any, **options: Any) -> bytes:
    try:
        return json.dumps(value, ensure_ascii=False, **options).encode()
    except RecursionError as exc:
        raise InvalidJSON("nested too deep to encode") from exc
