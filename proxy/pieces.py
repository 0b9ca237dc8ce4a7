"""A request body in pieces: slices of the client's body and the parts encoded around them,
written to the engine's socket as they are (one writev) and never joined into one buffer.
At 1 MB the join was a copy of the whole history on every step, for bytes that only pass
through."""

from __future__ import annotations

from collections.abc import Iterable


class Pieces:
    __slots__ = ("length", "parts")

    def __init__(self, parts: Iterable[bytes | memoryview]) -> None:
        self.parts = tuple(parts)
        self.length = sum(map(len, self.parts))  # bytes: every view is of bytes

    def __len__(self) -> int:
        return self.length

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)


Body = bytes | Pieces


def joined(body: Body) -> bytes:
    """The body as one bytes object (a copy only for pieces)."""
    return body if isinstance(body, bytes) else bytes(body)
