"""Server-sent events: split a byte stream into whole events and read their payloads. No I/O.

Events end with a blank line; the spec allows CRLF, LF or CR line endings
(https://html.spec.whatwg.org/multipage/server-sent-events.html#parsing-an-event-stream).
"""

from __future__ import annotations

_BOUNDARIES = (b"\n\n", b"\r\n\r\n", b"\r\r")


def _boundary_end(buffer: bytes, start: int, any_cr: bool) -> int:
    """Index just past the first event terminator at or after ``start``, or -1."""
    if not any_cr:  # the common case (vLLM writes LF only): one scan
        found = buffer.find(b"\n\n", start)
        return found + 2 if found >= 0 else -1
    best = -1
    for boundary in _BOUNDARIES:
        found = buffer.find(boundary, start)
        if found >= 0 and (best < 0 or found + len(boundary) < best):
            best = found + len(boundary)
    return best


class EventSplitter:
    """Feed it chunks as they arrive; it returns each whole event, bytes unchanged.

    Only an incomplete trailing event is held back: a client cannot act on it anyway.
    """

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        buffer = self._pending + chunk if self._pending else chunk
        events: list[bytes] = []
        start = 0
        any_cr = b"\r" in buffer
        while (end := _boundary_end(buffer, start, any_cr)) >= 0:
            events.append(buffer[start:end])
            start = end
        self._pending = buffer[start:]
        return events

    def flush(self) -> bytes:
        """Whatever was left when the stream ended (an unterminated last event)."""
        rest, self._pending = self._pending, b""
        return rest


def event_data(event: bytes) -> bytes | None:
    """The event's data field (multi-line data joined by LF), or None if it has none."""
    if (
        event.startswith(b"data: ")
        and event.endswith(b"\n\n")
        and event.count(b"\n") == 2
        and b"\r" not in event
    ):
        return event[6:-2]  # the usual one-line event, without copying twice
    lines = event.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    data = [line[5:].removeprefix(b" ") for line in lines if line.startswith(b"data:")]
    return b"\n".join(data) if data else None


DONE = b"[DONE]"
