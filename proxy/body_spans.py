"""Where each element of a JSON body's top-level array is, in the body's bytes: the
history of a chat request (``messages``) or of a Responses request (``input``). msgspec
reads the elements as raw bytes, which gives their lengths; the gaps between them are
checked to be whitespace and one comma. What cannot be told for sure is None. Pure.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import msgspec

Span = tuple[int, int]  # a message's bytes in its body: body[start:end]

_GAP = re.compile(rb"[ \t\n\r]*,[ \t\n\r]*")


@dataclasses.dataclass(frozen=True)
class Array:
    """The top-level array a body's history is: ``messages`` (chat completions), ``input``
    (the Responses API)."""

    key: str
    quoted: bytes  # the key as JSON writes it
    opening: re.Pattern[bytes]  # the key, its colon and the array's bracket
    decoder: msgspec.json.Decoder[Any]  # the array's elements as raw bytes, the rest skipped

    @classmethod
    def of(cls, key: str) -> Array:
        quoted = b'"' + key.encode() + b'"'
        elements = msgspec.defstruct("Elements", [(key, list[msgspec.Raw], [])])
        return cls(
            key,
            quoted,
            re.compile(re.escape(quoted) + rb"[ \t\n\r]*:[ \t\n\r]*\[[ \t\n\r]*"),
            msgspec.json.Decoder(elements),
        )


MESSAGES = Array.of("messages")
INPUT = Array.of("input")


def scan(body: bytes, array: Array = MESSAGES) -> list[msgspec.Raw] | None:
    """The raw bytes of each element of the body's array; None if the body is not a JSON
    object with such an array that msgspec reads (NaN literals, ...)."""
    try:
        elements: list[msgspec.Raw] = getattr(array.decoder.decode(body), array.key)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return elements


def walk(body: bytes, start: int, raws: list[msgspec.Raw]) -> list[Span] | None:
    """Each element's span, the first starting at ``start`` and each next one after a
    comma: the elements' lengths are msgspec's, the gaps only whitespace and one comma."""
    spans: list[Span] = []
    position = start
    for index, raw in enumerate(raws):
        if index:
            gap = _GAP.match(body, position)
            if gap is None:
                return None
            position = gap.end()
        end = position + len(raw)
        spans.append((position, end))
        position = end
    return spans


def message_spans(body: bytes, array: Array = MESSAGES) -> tuple[int, list[Span]] | None:
    """Where the body's array opens (the offset of its first element) and where each of
    its elements is: None where that cannot be told for sure (its key written more than
    once anywhere in the body, which a nested object or a string may do, or a body msgspec
    does not read)."""
    if body.count(array.quoted) != 1:
        return None
    opened = array.opening.search(body)
    raws = scan(body, array) if opened is not None else None
    if opened is None or raws is None:
        return None
    spans = walk(body, opened.end(), raws)
    return None if spans is None else (opened.end(), spans)
