"""A reply goes to the client before the proxy records it (the bookkeeping is off the
client's wait), yet the client's next request, sent the moment the reply is out (a
non-streamed reply's last byte, a stream's [DONE]), still finds the reply in its session:
with a store that never waits nothing runs in between, and a store that waits (a shared
one) is saved before the reply goes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from proxy import app as app_module
from proxy import config
from proxy.app import create_app
from proxy.sessions import MemoryStore, Session

pytestmark = pytest.mark.anyio

SYSTEM = {"role": "system", "content": "You are an airline agent."}
USER = {"role": "user", "content": "Change my flight ABC123 to Friday."}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_reservation", "arguments": '{"id":"ABC123"}'},
}
EMITTED = {
    "role": "assistant",
    "content": None,
    "reasoning_content": "Look it up.",
    "tool_calls": [CALL],
}
# As a client sends the reply back: reasoning dropped, arguments re-serialized.
SENT_BACK = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{**CALL, "function": {**CALL["function"], "arguments": '{"id": "ABC123"}'}}],
}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": '{"flights": 2}'}
SAVE_ROUNDS = 20


class WaitingStore(MemoryStore):
    """A store whose calls yield to the event loop, as a networked one's do; a save takes
    a few rounds of it (a script on the server), a read one."""

    waits = True

    async def get(self, key: str) -> Session | None:
        await asyncio.sleep(0)
        return await super().get(key)

    async def save(self, session: Session) -> bool:
        for _ in range(SAVE_ROUNDS):
            await asyncio.sleep(0)
        return await super().save(session)


def engine(seen: list[dict[str, Any]]) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.read()))
        choice = {"index": 0, "message": EMITTED, "finish_reason": "tool_calls"}
        usage = {"prompt_tokens": 50, "completion_tokens": 9, "total_tokens": 59}
        reply = {"choices": [choice], "usage": usage}
        return httpx.Response(200, json=reply)

    return httpx.MockTransport(answer)


def stream_events() -> list[bytes]:
    """The reply above as a stream: reasoning, the call, its finish, usage, [DONE]."""
    chunks: list[dict[str, Any]] = [
        {"delta": {"role": "assistant", "reasoning_content": "Look it up."}},
        {"delta": {"tool_calls": [{"index": 0, **CALL}]}},
        {"delta": {}, "finish_reason": "tool_calls"},
    ]
    events = [
        {"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, **chunk}]}
        for chunk in chunks
    ]
    usage = {"prompt_tokens": 50, "completion_tokens": 9, "total_tokens": 59}
    events.append({"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": usage})
    return [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


def streaming_engine(seen: list[dict[str, Any]]) -> httpx.MockTransport:
    """An engine whose stream yields to the event loop between events and before its end,
    as bytes arriving over a socket do: whatever the proxy leaves to run there does."""

    async def body() -> Any:
        for event in stream_events():
            await asyncio.sleep(0)
            yield event
        await asyncio.sleep(0)

    async def answer(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(await request.aread()))
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    return httpx.MockTransport(answer)


def scope(body: bytes) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"proxy"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"x-session-id", b"order"),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }


async def call(
    app: Any, messages: list[dict[str, Any]], on_last_byte: Any = None, *, stream: bool = False
) -> int:
    """One request through the app's ASGI interface; ``on_last_byte`` runs as the reply's
    last body message is sent (where a client would have it all), or for a stream the one
    with its [DONE] (where a client may act on it)."""
    request: dict[str, Any] = {"model": "m", "messages": messages}
    if stream:
        request["stream"] = True
    body = json.dumps(request).encode()
    delivered = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # no disconnect: wait until cancelled
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif on_last_byte is not None and reply_out(message):
            on_last_byte()

    def reply_out(message: dict[str, Any]) -> bool:
        if stream:
            return b"[DONE]" in message.get("body", b"")
        return not message.get("more_body")

    await app(scope(body), receive, send)
    return status


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("store", [None, WaitingStore], ids=["memory", "waiting"])
async def test_the_next_request_sent_at_the_reply_s_last_byte_finds_it(store, stream, monkeypatch):
    if store is not None:
        monkeypatch.setattr(app_module, "session_store", lambda s, m: store(100, 600.0))
    seen: list[dict[str, Any]] = []
    settings = config.load({"upstream": "http://engine:8000"}, environ={})
    transport = streaming_engine(seen) if stream else engine(seen)
    app = create_app(settings, transport=transport, registry=CollectorRegistry())
    next_step: list[asyncio.Task[int]] = []
    second = [SYSTEM, USER, SENT_BACK, RESULT]

    def send_next() -> None:  # the client's next step, started the moment it has the reply
        step = call(app, second, stream=stream)
        next_step.append(asyncio.get_running_loop().create_task(step))

    assert await call(app, [SYSTEM, USER], on_last_byte=send_next, stream=stream) == 200
    assert await next_step[0] == 200
    # The reply went back as the engine emitted it: the second step found it recorded.
    (forwarded,) = [request for request in seen if request["messages"][-1] == RESULT]
    restored = forwarded["messages"][2]
    assert restored["reasoning_content"] == EMITTED["reasoning_content"]
    assert restored["tool_calls"] == EMITTED["tool_calls"]
    if not stream:
        assert restored == EMITTED
