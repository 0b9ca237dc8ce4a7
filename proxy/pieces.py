"""A request body in pieces: slices of the client's body and the parts encoded around them,
written to the engine's socket as they are (one writev) and never joined into one buffer.
At 1 MB the join was a copy of the whole history on every step, for bytes that only pass
through."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence


class Pieces:
    """Parts of a body, in order. ``origins``, where known, says where each part was cut
    from the client's body (its offset there; -1: encoded by the proxy), and
    ``history_end`` where in this body its array of messages ends (-1: unknown): what a
    ``Lead`` is made of."""

    __slots__ = ("history_end", "length", "origins", "parts")

    def __init__(
        self,
        parts: Iterable[bytes | memoryview],
        origins: Sequence[int] | None = None,
        history_end: int = -1,
    ) -> None:
        self.parts = tuple(parts)
        self.length = sum(map(len, self.parts))  # bytes: every view is of bytes
        self.origins = origins
        self.history_end = history_end

    def __len__(self) -> int:
        return self.length

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)


Body = bytes | Pieces


def joined(body: Body) -> bytes:
    """The body as one bytes object (a copy only for pieces)."""
    return body if isinstance(body, bytes) else bytes(body)


# A part of a Lead: the client's body's bytes from one offset to another, or encoded bytes.
Part = tuple[int, int] | bytes


@dataclasses.dataclass(frozen=True)
class Lead:
    """What a forwarded body held up to the end of its messages, told so the next body of
    its conversation can build it again: the client's bytes where they were passed on (by
    their place in the client's body, which the next body starts with), the proxy's own
    bytes where it encoded some. The proxy keeps a conversation's history byte-stable, so
    the next forwarded body starts with these bytes too, which ``after`` checks."""

    parts: tuple[Part, ...]

    @classmethod
    def of(cls, forwarded: Body, body: bytes, kept: int) -> Lead | None:
        """``forwarded``'s lead, where it is known: ``body`` (the client's, whose messages
        end at ``kept``) passed on as it is, or pieces that say where their messages end."""
        if forwarded is body:
            return cls(((0, kept),))
        if not isinstance(forwarded, Pieces) or forwarded.origins is None:
            return None
        end, origins = forwarded.history_end, forwarded.origins
        if end < 0:  # the client's bytes with fields added after them
            first = forwarded.parts[0]
            return cls(((0, kept),)) if origins[0] == 0 and len(first) >= kept else None
        parts: list[Part] = []
        position = 0
        for part, origin in zip(forwarded.parts, origins, strict=True):
            size = min(len(part), end - position)
            if origin >= 0:
                parts.append((origin, origin + size))
            elif isinstance(part, bytes) and size == len(part):  # encoded, whole: as it is
                parts.append(part)
            else:
                parts.append(bytes(part[:size]))
            position += size
            if position == end:
                return cls(tuple(parts))
        return None

    def rebuilt(self, body: bytes) -> Pieces:
        """The lead's bytes, the client's parts cut from ``body`` (not copied)."""
        view = memoryview(body)
        parts = [
            view[part[0] : part[1]] if isinstance(part, tuple) else part for part in self.parts
        ]
        return Pieces(parts)

    def __len__(self) -> int:
        return sum(
            part[1] - part[0] if isinstance(part, tuple) else len(part) for part in self.parts
        )


def after(forwarded: Body, body: bytes, lead: Lead) -> Body | None:
    """What ``forwarded`` holds after its first bytes, where those are ``lead``'s rebuilt
    from ``body`` (the client's body ``forwarded`` was made from); else None. A part of
    both cut from the same place of ``body`` is the same without a look; any other pair
    is compared (memcmp)."""
    if isinstance(forwarded, Pieces):
        parts, origins = forwarded.parts, forwarded.origins
    else:
        parts, origins = (forwarded,), (0 if forwarded is body else -1,)
    index, into = 0, 0  # the part of ``forwarded`` reached, and how far into it
    for part in lead.parts:
        source, at, size = (body, *part) if isinstance(part, tuple) else (part, 0, len(part))
        if isinstance(part, tuple):
            size -= at
        while size:
            if index == len(parts):
                return None
            piece = parts[index]
            origin = -1 if origins is None else origins[index]
            step = min(size, len(piece) - into)
            same_place = source is body and origin >= 0 and origin + into == at
            if not same_place and not source.startswith(memoryview(piece)[into : into + step], at):
                return None
            at, size, into = at + step, size - step, into + step
            if into == len(piece):
                index, into = index + 1, 0
    rest = [memoryview(parts[index])[into:], *parts[index + 1 :]] if index < len(parts) else []
    return Pieces(rest)
