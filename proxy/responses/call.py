"""The Responses API story: the chat story (proxy.chat) on another wire format.

    parse -> to chat -> session -> rewrite -> compaction -> to Responses -> forward
          -> relay the typed events -> record the reply (its output items, as emitted)

The request is read into the chat conversation the pipeline works on
(proxy.responses.items); what the pipeline and compaction made of it is written back
into the client's request, so a request nothing changed goes upstream as the client's
bytes. A request chained on an earlier response (``previous_response_id``) carries only
its new items: the engine holds the rest, so it is never compacted or restored, only
rewritten where the rewrites are its own (instructions, tools, the newest items).
"""

from __future__ import annotations

import logging
from typing import Any

from proxy import jsonio
from proxy.bodies import BodyCache
from proxy.chat import ChatCall, ChatServices
from proxy.downstream import Downstream
from proxy.errors import ProxyError
from proxy.pieces import Body
from proxy.relay import StreamWatcher
from proxy.responses import events, items
from proxy.turn import Turn

RESPONSES_ROUTE = "/v1/responses"
log = logging.getLogger("prefill_proxy.responses")


def conversation_id(value: Any) -> str:
    """``conversation`` as its id: a string, or an object with one."""
    if isinstance(value, dict):
        value = value.get("id")
    return value if isinstance(value, str) else ""


class ResponsesCall(ChatCall):
    route = RESPONSES_ROUTE

    def __init__(self, services: ChatServices, down: Downstream) -> None:
        super().__init__(services, down)
        self.original: dict[str, Any] = {}
        self.stream_watcher: events.ResponsesStreamWatcher | None = None

    def body_cache(self) -> BodyCache | None:
        return self.chat.response_bodies

    def read_request(self, body: bytes) -> dict[str, Any]:
        parsed = self.parse_body(body, self.body_cache())
        original = self.original = parsed.payload
        self.known, self.kept = parsed.known, parsed.kept
        try:
            return items.to_chat(original, self.known.converted if self.known else None)
        except items.NotAConversation as exc:  # the engine judges it, as it was sent
            log.debug("responses request forwarded as sent: %s", exc)
            self.rewriting = False
            return {"model": original.get("model"), "stream": original.get("stream")}

    async def open_session(self, payload: dict[str, Any]) -> Turn | None:
        sessions = self.chat.sessions
        if sessions is None:
            return None
        chained = self.original.get("previous_response_id")
        turn = await sessions.open(
            self.down.headers,
            payload,
            conversation=conversation_id(self.original.get("conversation")),
            chained_to=chained if isinstance(chained, str) else "",
            known=self.known,
        )
        self.credit(turn)
        return turn

    def ask_for_usage(self, forwarded: dict[str, Any]) -> dict[str, Any]:
        return forwarded  # a response always reports its usage

    def encode(self, forwarded: dict[str, Any], body: bytes) -> Body:
        """The client's request with the conversation the pipeline made."""
        try:
            wire = items.to_responses(self.original, forwarded, self.payload)
        except Exception as exc:  # fail open: the client's own bytes go instead
            self.chat.failures.failed("responses encode", exc)
            self.exchange.rewrite_failures += ("encode",)
            return body
        return body if wire is self.original else super().encode(wire, body)

    def read_reply(self, body: bytes) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        try:
            response = jsonio.loads(body)
        except jsonio.InvalidJSON:
            return None, None
        self.note_response(response)
        return events.usage(response), events.reply_message(response)

    def note_response(self, response: Any) -> None:
        """The response's id, so a request chaining on it finds this session."""
        if self.turn is None or not isinstance(response, dict):
            return
        if isinstance(response.get("id"), str) and self.original.get("store") is not False:
            self.turn.response_id = response["id"]

    def watcher(self) -> StreamWatcher:
        watcher = self.stream_watcher = events.ResponsesStreamWatcher(
            self.exchange,
            on_reply=self.record_streamed_reply if self.turn is not None else None,
            max_event=self.settings.max_sse_event_bytes,
            max_reply_chars=self.settings.max_reply_chars,
        )
        return watcher

    async def record_streamed_reply(self) -> None:
        if self.stream_watcher is not None and self.stream_watcher.response_id:
            self.note_response({"id": self.stream_watcher.response_id})
        await self.record_reply()

    def stream_error_event(self, error: ProxyError) -> bytes:
        if self.stream_watcher is not None:
            return self.stream_watcher.error_event(error)
        return events.error_event(error)
