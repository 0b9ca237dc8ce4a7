"""Server-sent events: split a byte stream into whole events and read their payloads. No I/O.

Events end with a blank line; the spec allows CRLF, LF or CR line endings
(https://html.spec.whatwg.org/multipage/server-sent-events.html#parsing-an-event-stream).
"""

from __future__ import annotations

from typing import Any

from proxy import jsonio

_BOUNDARIES = (b"\n\n", b"\r\n\r\n", b"\r\r")


def _boundary_end(buffer: bytes | bytearray, start: int, any_cr: bool) -> int:
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


class EventTooLarge(ValueError):
    """An event grew past the splitter's limit without ending."""


class EventSplitter:
    """Feed it chunks as they arrive; it returns each whole event, bytes unchanged.

    Only an incomplete trailing event is held back: a client cannot act on it anyway.
    Work is linear in the bytes fed, however an event is split (a held event is appended
    to, and only its new bytes are searched), and a held event is bounded by
    ``max_event`` bytes (``EventTooLarge``), so one unending event costs neither
    quadratic time nor unbounded memory.
    """

    def __init__(self, max_event: int | None = None) -> None:
        self._pending = bytearray()
        self._max = max_event
        self._any_cr = False

    def feed(self, chunk: bytes) -> list[bytes]:
        self._any_cr = self._any_cr or b"\r" in chunk
        if not self._pending:  # the common case: the chunk holds whole events
            buffer: bytes | bytearray = chunk
            start = scan = 0
        else:
            scan = max(len(self._pending) - 3, 0)  # a terminator may span the two
            self._pending += chunk
            buffer, start = self._pending, 0
        events: list[bytes] = []
        while (end := _boundary_end(buffer, max(start, scan), self._any_cr)) >= 0:
            events.append(bytes(buffer[start:end]))
            start = end
        rest = buffer[start:]
        if self._max is not None and len(rest) > self._max:
            self._pending = bytearray()
            raise EventTooLarge(f"an event grew past {self._max} bytes without ending")
        self._pending = bytearray(rest) if buffer is chunk or start else self._pending
        return events

    def flush(self) -> bytes:
        """Whatever was left when the stream ended (an unterminated last event)."""
        rest, self._pending = bytes(self._pending), bytearray()
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


def json_object(data: bytes | None) -> dict[str, Any] | None:
    """An event's data as a JSON object, or None (no data, [DONE], not an object)."""
    if data is None or data == DONE:
        return None
    try:
        payload = jsonio.loads(data)
    except jsonio.InvalidJSON:
        return None
    return payload if isinstance(payload, dict) else None
