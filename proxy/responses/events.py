"""Reading what a Responses API engine answers (no I/O): a response's usage and reply (the
session record's), and its event stream as it passes: token times, usage, the reply.
Every byte goes on unchanged.

vLLM writes each event as ``event: <type>`` and ``data: <json>`` with the same ``type``
in the payload (vllm/entrypoints/openai/responses/api_router.py); the stream ends with
``response.completed`` (or ``response.incomplete`` / ``response.failed``) and no
``[DONE]``. The terminal event carries the whole response: its output items, as emitted,
and its usage.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from proxy import jsonio, sse
from proxy.errors import ProxyError
from proxy.exchange import Exchange
from proxy.relay import EventWatcher
from proxy.responses import items

# Deltas of generated output: the first one is the first token.
OUTPUT_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.refusal.delta",
        "response.custom_tool_call_input.delta",
    }
)
# Terminal events whose output is the reply as the client will send it back.
REPLY_EVENTS = frozenset({"response.completed", "response.incomplete"})
TERMINAL_EVENTS = REPLY_EVENTS | {"response.failed"}


def reply_message(response: Any) -> dict[str, Any] | None:
    """The assistant message standing for a response's output items (as emitted), None
    without output."""
    output = response.get("output") if isinstance(response, dict) else None
    if not isinstance(output, list) or not output:
        return None
    turn = [item for item in output if isinstance(item, dict)]
    if not turn or not all(items.is_assistant_item(item) for item in turn):
        return None  # built-in tool calls: not a turn the session can restore
    return items.assistant_message(turn)


def usage(response: Any) -> dict[str, Any] | None:
    """A response's usage in chat-completion terms (what metrics and sessions read)."""
    given = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(given, dict):
        return None
    details = given.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return {
        "prompt_tokens": given.get("input_tokens"),
        "completion_tokens": given.get("output_tokens"),
        "prompt_tokens_details": {"cached_tokens": cached or 0},
    }


def reply_text_length(reply: dict[str, Any]) -> int:
    calls = reply.get("tool_calls") or ()
    arguments = sum(len(str(c.get("function", {}).get("arguments") or "")) for c in calls)
    return len(reply.get("content") or "") + arguments


class ResponsesStreamWatcher(EventWatcher):
    def __init__(
        self,
        exchange: Exchange,
        *,
        on_reply: Callable[[], Awaitable[None]] | None = None,
        max_event: int | None = None,
        max_reply_chars: int | None = None,
    ) -> None:
        super().__init__(exchange, on_reply, max_event)  # the reply: at the terminal event
        self._max_reply_chars = max_reply_chars
        self._sequence = -1
        self.reply_too_long = False
        self.response_id: str | None = None

    def relay(self, chunk: bytes, now: float) -> bytes:
        events = self._splitter.feed(chunk)
        for event in events:
            self._read(event, now)
        return b"".join(events)

    def flush(self) -> bytes:
        return self._splitter.flush()

    def error_event(self, error: ProxyError) -> bytes:
        """The stream's last event when the upstream fails mid-stream: the Responses
        ``error`` event, numbered after the last one relayed."""
        return error_event(error, self._sequence + 1)

    def _read(self, event: bytes, now: float) -> None:
        payload = sse.json_object(sse.event_data(event))
        if payload is None:
            return
        sequence = payload.get("sequence_number")
        if isinstance(sequence, int):
            self._sequence = max(self._sequence, sequence)
        kind = payload.get("type")
        if kind in OUTPUT_DELTAS:
            self._exchange.mark_token(now)
        elif kind == "error":
            self.error = payload
        elif kind in TERMINAL_EVENTS:
            self._terminal(kind, payload.get("response"))

    def _terminal(self, kind: str, response: Any) -> None:
        exchange = self._exchange
        exchange.usage = usage(response) or exchange.usage
        if isinstance(response, dict) and isinstance(response.get("id"), str):
            self.response_id = response["id"]
        if kind not in REPLY_EVENTS or self._on_reply is None:
            return
        reply = reply_message(response)
        if reply is None:
            return
        limit = self._max_reply_chars
        if limit is not None and reply_text_length(reply) > limit:
            self.reply_too_long = True
            return
        exchange.reply = reply
        self.reply_ready = True


def error_event(error: ProxyError, sequence: int = 0) -> bytes:
    body = error.body().get("error") or {}
    payload = {
        "type": "error",
        "code": body.get("code") or body.get("type"),
        "message": body.get("message"),
        "param": body.get("param"),
        "sequence_number": sequence,
    }
    return b"event: error\ndata: " + jsonio.dumps(payload) + b"\n\n"
