"""JSON in and out: orjson for speed, the standard library for what orjson refuses.

orjson rejects integers beyond 64 bits and the NaN/Infinity literals that Python's json
(and so many clients) accept; such bodies must still pass, so they fall back.
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
