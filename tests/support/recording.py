"""The proxy with both sides recorded, for end-to-end tests with real clients: what each
client sent it (an ASGI layer in front of the app) and the chat bodies it sent upstream
(its own ``log_bodies`` log). Plus readers for a tool loop seen in that traffic."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry

from proxy import config
from proxy.app import create_app
from proxy.call import body_log
from proxy.chat import CHAT_ROUTE
from tests.support.proxies import RunningProxy
from tests.support.servers import serve


@dataclasses.dataclass
class Exchange:
    """One HTTP request as the client sent it, and the response bytes it got back."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes = b""
    status: int | None = None
    response: bytes = b""

    def json(self) -> dict[str, Any]:
        return json.loads(self.body)

    def response_events(self) -> list[dict[str, Any]]:
        """The response as JSON objects: the one body, or each SSE event of a stream."""
        if not self.response.lstrip().startswith((b"data:", b"event:")):
            return [json.loads(self.response)]
        events = []
        for block in self.response.split(b"\n\n"):
            for line in block.split(b"\n"):  # a Responses event names its type first
                data = line.removeprefix(b"data: ")
                if line.startswith(b"data: ") and data != b"[DONE]":
                    events.append(json.loads(data))
        return events


class RecordingApp:
    """ASGI middleware that keeps every HTTP exchange the wrapped app serves."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.exchanges: list[Exchange] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        exchange = Exchange(scope["method"], scope["path"], headers)
        self.exchanges.append(exchange)

        async def recording_receive() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                exchange.body += message.get("body", b"")
            return message

        async def recording_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
            elif message["type"] == "http.response.body":
                exchange.response += message.get("body", b"")
            await send(message)

        await self.app(scope, recording_receive, recording_send)


class ForwardedBodies(logging.Handler):
    """Chat request bodies as the proxy sent them upstream (its ``log_bodies`` lines)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.bodies: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("request "):
            self.bodies.append(json.loads(message.removeprefix("request ")))


@dataclasses.dataclass
class RecordedProxy(RunningProxy):
    exchanges: list[Exchange]
    forwarded: list[dict[str, Any]]

    @property
    def chat(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.path == CHAT_ROUTE]

    def total(self, name: str, **labels: str) -> float:
        """The sum of ``name``'s samples whose labels include ``labels``."""
        return sum(
            sample.value
            for metric in self.registry.collect()
            for sample in metric.samples
            if sample.name == name and labels.items() <= sample.labels.items()
        )


@contextlib.contextmanager
def recorded_proxy(upstream: str, **overrides: Any) -> Iterator[RecordedProxy]:
    """The proxy in front of ``upstream`` on a loopback port, both sides recorded."""
    registry = CollectorRegistry()
    settings = config.load({"upstream": upstream, "log_bodies": True, **overrides}, environ={})
    app = RecordingApp(create_app(settings, registry=registry))
    handler = ForwardedBodies()
    level = body_log.level
    body_log.setLevel(logging.INFO)
    body_log.addHandler(handler)
    try:
        with serve(app) as url:
            yield RecordedProxy(url, registry, app.exchanges, handler.bodies)
    finally:
        body_log.removeHandler(handler)
        body_log.setLevel(level)


@dataclasses.dataclass(frozen=True)
class ToolRound:
    """One tool call across two chat requests: the model emits it in the answer to the
    first, the client sends it back (with the tool's result) in the second."""

    call_id: str
    name: str
    emitted: str  # the arguments string in the model's answer
    sent_back: str  # the same call's arguments in the client's next request
    forwarded: str  # ... and in the request the proxy sent upstream
    result: str  # the content of the tool message answering the call


def emitted_tool_calls(exchange: Exchange) -> list[dict[str, str]]:
    """The tool calls in a chat completion answer, streamed or not: id, name, arguments."""
    calls: dict[int, dict[str, str]] = {}
    for event in exchange.response_events():
        for choice in event.get("choices") or []:
            message = choice.get("message") or choice.get("delta") or {}
            for position, call in enumerate(message.get("tool_calls") or []):
                slot = calls.setdefault(
                    call.get("index", position), {"id": "", "name": "", "arguments": ""}
                )
                function = call.get("function") or {}
                slot["id"] = call.get("id") or slot["id"]
                slot["name"] += function.get("name") or ""
                slot["arguments"] += function.get("arguments") or ""
    return [calls[index] for index in sorted(calls)]


def _sent_call(messages: list[dict[str, Any]], call_id: str) -> tuple[str, str]:
    """(arguments, tool result) for ``call_id`` in a request's messages."""
    arguments = [
        call["function"]["arguments"]
        for message in messages
        if message.get("role") == "assistant"
        for call in message.get("tool_calls") or []
        if call.get("id") == call_id
    ]
    results = [
        message.get("content")
        for message in messages
        if message.get("role") == "tool" and message.get("tool_call_id") == call_id
    ]
    assert len(arguments) == 1, f"assistant tool call {call_id} sent back {len(arguments)} times"
    assert len(results) == 1, f"tool result for {call_id} sent {len(results)} times"
    result = results[0]
    return arguments[0], result if isinstance(result, str) else json.dumps(result)


def tool_round(proxy: RecordedProxy) -> ToolRound:
    """The tool round in a proxy's first two chat exchanges (asserting its shape)."""
    assert len(proxy.chat) >= 2, f"{len(proxy.chat)} chat requests reached the proxy"
    first, second = proxy.chat[0], proxy.chat[1]
    assert first.status == second.status == 200
    calls = emitted_tool_calls(first)
    assert len(calls) == 1, f"the model's first answer had tool calls {calls}"
    (call,) = calls
    sent_back, result = _sent_call(second.json()["messages"], call["id"])
    forwarded, _ = _sent_call(proxy.forwarded[1]["messages"], call["id"])
    return ToolRound(call["id"], call["name"], call["arguments"], sent_back, forwarded, result)
