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


class InvalidJSON(ValueError):
    pass


def loads(data: bytes | str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        try:
            return json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidJSON(str(exc)) from exc


def dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def dumps_canonical(value: Any) -> bytes:
    """Keys sorted: equal values give equal bytes (for hashing, not for sending)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str).encode()
