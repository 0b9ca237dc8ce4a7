"""Reading a streamed chat completion as a client does: when the first token came, the
usage, and an error event. Bytes in, no I/O, any chunking."""

from __future__ import annotations

from typing import Any

from proxy import sse
from proxy.chunks import ReplyAssembler, carries_token
from proxy.responses import events

OVERHEAD_HEADER = "x-prefill-proxy-overhead-ms"  # proxy.headers.OVERHEAD
COMPACTION_HEADER = "x-prefill-proxy-compaction"
"""Set by the proxy on the response to a request that carried a new compaction event; its
value is the kind (elide, summary, fallback)."""


class StreamObserver:
    """Feed it the response body as it arrives, with the time each chunk came: a chat
    completion's chunks or a Responses API's typed events."""

    def __init__(self, *, assemble: bool = False) -> None:
        self._splitter = sse.EventSplitter()
        # The reply as emitted (chat completions), when asked for: reading every chunk.
        self._assembler = ReplyAssembler() if assemble else None
        self.first_token_at: float | None = None
        self.usage: dict[str, Any] | None = None
        self.error: str | None = None

    @property
    def reply(self) -> dict[str, Any] | None:
        """The assistant message the stream carried (only when built to assemble it)."""
        return self._assembler.message() if self._assembler is not None else None

    def feed(self, chunk: bytes, now: float) -> None:
        for event in self._splitter.feed(chunk):
            self._read(event, now)

    def close(self, now: float) -> None:
        rest = self._splitter.flush()
        if rest.strip():
            self._read(rest, now)

    def _read(self, event: bytes, now: float) -> None:
        data = sse.event_data(event)
        if data is None or data == sse.DONE:
            return
        # After the first token only usage and errors matter: skip parsing the rest.
        if (
            self._assembler is None
            and self.first_token_at is not None
            and b'"usage"' not in data
            and b'"error"' not in data
        ):
            return
        payload = sse.json_object(data)
        if payload is None:
            return
        kind = payload.get("type")
        if kind is not None:  # a Responses event
            self._read_typed(kind, payload, now)
            return
        if "error" in payload:
            self.error = error_message(payload)
        if self._assembler is not None:
            self._assembler.feed(payload)
        if isinstance(payload.get("usage"), dict):
            self.usage = payload["usage"]
        choices = payload.get("choices")
        if self.first_token_at is None and choices and any(carries_token(c) for c in choices):
            self.first_token_at = now

    def _read_typed(self, kind: Any, payload: dict[str, Any], now: float) -> None:
        if kind in events.OUTPUT_DELTAS and self.first_token_at is None:
            self.first_token_at = now
        elif kind == "error":
            self.error = str(payload.get("message") or payload)[:500]
        elif kind in events.TERMINAL_EVENTS:
            self.usage = events.usage(payload.get("response")) or self.usage
            if kind == "response.failed":
                failed = payload.get("response")
                self.error = error_message(failed) if isinstance(failed, dict) else "failed"


def overhead_ms(value: str | None) -> float | None:
    """The proxy's overhead header as a number; None when absent or not a number."""
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def error_message(payload: Any) -> str:
    """The message of an OpenAI-style error body, or the body itself, shortened."""
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])[:500]
    if isinstance(error, str):
        return error[:500]
    return str(payload)[:500]


def token_counts(usage: dict[str, Any] | None) -> tuple[int | None, int | None]:
    """(prompt tokens, cached tokens) from a usage object; None where it has none.

    vLLM reports cached tokens only with ``--enable-prompt-tokens-details``."""
    if not isinstance(usage, dict):
        return None, None
    prompt = usage.get("prompt_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return (
        prompt if isinstance(prompt, int) else None,
        cached if isinstance(cached, int) else None,
    )
