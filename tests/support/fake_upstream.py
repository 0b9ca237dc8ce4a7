"""A small OpenAI-like upstream on raw asyncio sockets, for what vLLM will not do on demand:
refuse, reset mid-stream, stall, answer 5xx. Also a fast upstream for the overhead benchmark.

Behaviour is chosen per request by the ``x-fault`` header (the proxy forwards it):
``reset-mid-stream``, ``stall-headers``, ``stall-mid-stream``, ``status-503``,
``trickle-mid-stream`` (after two events, a comment every 0.1 s until the peer closes),
``set-cookie`` (a non-stream reply that sets a cookie),
``status-400``, ``close-after-request``, ``bad-status-line``, ``tokens-N`` (a stream of N
content chunks), ``huge-event-N`` (after two
events, one of N bytes that never ends, sent in 64 KiB chunks). Without it, a
deterministic chat completion (stream or not) with usage.
It records every request it receives, so tests can check what the proxy forwarded
(``record=False`` turns that off, so a long benchmark run does not grow its memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import threading
from collections.abc import Iterator
from http import HTTPStatus
from typing import Any

USAGE = {
    "prompt_tokens": 40,
    "completion_tokens": 3,
    "total_tokens": 43,
    "prompt_tokens_details": {"cached_tokens": 32},
}
WORDS = ["Hello", " from", " upstream"]
PING = b": ping\n\n"  # an SSE comment: what a server sends to keep a quiet stream alive
TRICKLE_S = 0.1
# What a gateway in front of an engine may set for stickiness (fault ``set-cookie``).
SET_COOKIE = b"set-cookie: affinity=engine-1; Path=/\r\n"


@dataclasses.dataclass
class Received:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


FINGERPRINT = "fake-fp-1"


def chunk(
    delta: dict | None,
    *,
    finish: str | None = None,
    usage: dict | None = None,
    fingerprint: bool = False,
) -> bytes:
    payload: dict = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "fake",
    }
    payload["choices"] = (
        []
        if delta is None
        else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    )
    if usage is not None:
        payload["usage"] = usage
    if fingerprint:
        payload["system_fingerprint"] = FINGERPRINT
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def usage_of(prompt_tokens: int | None) -> dict:
    """USAGE, with ``prompt_tokens`` in place of its 40 (and no more cached than that)."""
    if prompt_tokens is None:
        return USAGE
    cached = min(USAGE["prompt_tokens_details"]["cached_tokens"], prompt_tokens)
    return {
        **USAGE,
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + USAGE["completion_tokens"],
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def stream_events(include_usage: bool, prompt_tokens: int | None = None) -> list[bytes]:
    """What vLLM sends: the fingerprint goes on the terminal chunk, or on the usage chunk
    when usage was asked for."""
    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": word}) for word in WORDS]
    events.append(chunk({}, finish="stop", fingerprint=not include_usage))
    if include_usage:
        events.append(chunk(None, usage=usage_of(prompt_tokens), fingerprint=True))
    events.append(b"data: [DONE]\n\n")
    return events


def responses_events() -> list[bytes]:
    """A Responses API stream as vLLM writes it: typed events, no [DONE]."""

    def event(sequence: int, kind: str, **fields: object) -> bytes:
        payload = {**fields, "sequence_number": sequence, "type": kind}
        data = json.dumps(payload, separators=(",", ":")).encode()
        return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"

    text = {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed"}
    usage = {
        "input_tokens": 5,
        "output_tokens": len(WORDS),
        "input_tokens_details": {"cached_tokens": 0},
    }
    response = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}
    events = [event(0, "response.created", response=response)]
    events += [
        event(i + 1, "response.output_text.delta", delta=word, item_id="msg_1", output_index=0)
        for i, word in enumerate(WORDS)
    ]
    part = {"type": "output_text", "text": "".join(WORDS), "annotations": []}
    done = {
        **response,
        "status": "completed",
        "output": [{**text, "content": [part]}],
        "usage": usage,
    }
    events.append(event(len(WORDS) + 1, "response.completed", response=done))
    return events


def completion_body(prompt_tokens: int | None = None) -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 1,
            "model": "fake",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(WORDS)},
                    "finish_reason": "stop",
                }
            ],
            "usage": usage_of(prompt_tokens),
        }
    ).encode()


def scanned_flags(body: bytes) -> dict[str, Any]:
    """A request's ``stream`` and ``stream_options.include_usage`` as its bytes hold them:
    the first key of each name, at any depth, that holds a boolean (quotes inside a JSON
    string are escaped, so text never reads as a key). Exact for bodies where no nested
    key of those names holds a boolean before the top-level one, as the benchmarks'."""

    def flag(key: bytes) -> bool:
        at = body.find(key)
        while at >= 0:
            rest = body[at + len(key) : at + len(key) + 16].lstrip()
            if rest.startswith(b":"):
                value = rest[1:].lstrip()
                if value.startswith((b"true", b"false")):
                    return value.startswith(b"true")
            at = body.find(key, at + 1)
        return False

    stream = flag(b'"stream"')
    return {
        "stream": stream,
        "stream_options": {"include_usage": stream and flag(b'"include_usage"')},
    }


class FakeUpstream:
    """Runs on its own event loop in a thread; ``url`` is set once it listens."""

    def __init__(
        self,
        *,
        token_delay: float = 0.0,
        port: int = 0,
        record: bool = True,
        max_model_len: int = 8192,
        bytes_per_token: float = 0.0,
        scan_flags: bool = False,
    ) -> None:
        self.token_delay = token_delay
        # Set: usage reports a prompt of the request body's bytes / this many tokens (a
        # long session's count grows as a real engine's does), instead of 40.
        self.bytes_per_token = bytes_per_token
        # Set: what a request asks for (stream, stream usage) is read off its bytes, not
        # parsed: parsing a 1 MB body took 4-5 ms of the upstream's CPU a request, half a
        # direct request's time there, which a benchmark's fast upstream must not spend.
        self.scan_flags = scan_flags
        self.max_model_len = max_model_len  # the context /v1/models reports
        self.port = port  # 0: any free port
        self.record = record
        self.received: list[Received] = []
        self.sent_events: list[list[bytes]] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._ready = threading.Event()
        self.peer_closed = threading.Event()  # a stalled stream's client hung up
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> FakeUpstream:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake upstream did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port, backlog=1024)
        )
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self._ready.set()
        self._loop.run_forever()
        self._server.close()
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                request = await _read_request(reader)
                if request is None:
                    break
                if self.record:
                    self.received.append(request)
                keep_open = await self._respond(request, reader, writer)
                if not keep_open:
                    break
        with contextlib.suppress(Exception):
            writer.close()

    async def _wait_for_peer_close(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Stall: send nothing more until the client (the proxy) closes the connection."""
        await writer.drain()
        while await reader.read(1024):
            pass
        self.peer_closed.set()

    async def _trickle_until_peer_close(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Alive but done: an SSE comment every TRICKLE_S (never a read timeout) until the
        client (the proxy) closes the connection."""
        while True:
            writer.write(b"%x\r\n%s\r\n" % (len(PING), PING))
            await writer.drain()
            try:
                async with asyncio.timeout(TRICKLE_S):
                    if not await reader.read(1024):
                        break
            except TimeoutError:
                continue
        self.peer_closed.set()

    async def _send_long_stream(self, writer: asyncio.StreamWriter, tokens: int) -> None:
        """A stream of ``tokens`` content chunks, written in batches of 1,000."""
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        token = chunk({"content": "word "})
        for start in range(0, tokens, 1000):
            batch = token * min(1000, tokens - start)
            writer.write(b"%x\r\n%s\r\n" % (len(batch), batch))
            await writer.drain()
        tail = chunk({}, finish="length") + b"data: [DONE]\n\n"
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail))
        await writer.drain()

    async def _send_endless_event(self, writer: asyncio.StreamWriter, size: int) -> None:
        piece = b"data: " + b"x" * (64 * 1024 - 6)
        sent = 0
        with contextlib.suppress(ConnectionError):
            while sent < size:
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
                sent += len(piece)
                piece = b"x" * (64 * 1024)
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async def _respond(
        self, request: Received, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        fault = request.header("x-fault") or ""
        if fault.startswith("status-"):
            status = int(fault.removeprefix("status-"))
            body = json.dumps(
                {"error": {"message": f"fake {status}", "type": "fake", "code": status}}
            ).encode()
            await _send(writer, status, "application/json", body)
            return True
        if fault == "close-after-request":  # read it, answer nothing, hang up
            return False
        if fault == "bad-status-line":  # not HTTP at all
            writer.write(b"SPAM EGGS\r\n\r\n")
            await writer.drain()
            return False
        if fault == "stall-headers":
            await self._wait_for_peer_close(reader, writer)
            return False
        if request.path.startswith("/v1/models"):
            body = json.dumps(
                {
                    "object": "list",
                    "data": [
                        {"id": "fake", "object": "model", "max_model_len": self.max_model_len}
                    ],
                }
            ).encode()
            await _send(writer, 200, "application/json", body)
            return True
        if request.path.startswith("/health"):
            await _send(writer, 200, "application/json", b"{}")
            return True
        payload = (
            scanned_flags(request.body) if self.scan_flags else json.loads(request.body or b"{}")
        )
        prompt_tokens = None
        if self.bytes_per_token:
            prompt_tokens = int(len(request.body) / self.bytes_per_token)
        if not payload.get("stream"):
            extra = SET_COOKIE if fault == "set-cookie" else b""
            await _send(writer, 200, "application/json", completion_body(prompt_tokens), extra)
            return True
        include_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
        if fault.startswith("tokens-"):
            await self._send_long_stream(writer, int(fault.removeprefix("tokens-")))
            return True
        responses = request.path.startswith("/v1/responses")
        events = responses_events() if responses else stream_events(include_usage, prompt_tokens)
        if self.record:
            self.sent_events.append(events)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        for index, event in enumerate(events):
            if index == 2 and fault == "reset-mid-stream":
                writer.transport.abort()  # RST: the connection dies mid-stream
                return False
            if index == 2 and fault == "stall-mid-stream":
                await self._wait_for_peer_close(reader, writer)
                return False
            if index == 2 and fault == "trickle-mid-stream":
                await self._trickle_until_peer_close(reader, writer)
                return False
            if index == 2 and fault.startswith("huge-event-"):
                await self._send_endless_event(writer, int(fault.removeprefix("huge-event-")))
                return False
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            if self.token_delay:
                await asyncio.sleep(self.token_delay)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


async def _read_request(reader: asyncio.StreamReader) -> Received | None:
    head = await reader.readuntil(b"\r\n\r\n")
    if not head:
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = [tuple(line.split(": ", 1)) for line in lines[1:] if line]
    if any(k.lower() == "transfer-encoding" and "chunked" in v for k, v in headers):
        body = await read_chunked(reader)
    else:
        length = next((int(v) for k, v in headers if k.lower() == "content-length"), 0)
        body = await reader.readexactly(length) if length else b""
    return Received(method, path, headers, body)  # type: ignore[arg-type]


async def read_chunked(reader: asyncio.StreamReader) -> bytes:
    """A chunked request body, whole (chunk extensions and trailers ignored)."""
    parts = []
    while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)
    while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers, then the empty line
        pass
    return b"".join(parts)


async def _send(
    writer: asyncio.StreamWriter, status: int, ctype: str, body: bytes, extra: bytes = b""
) -> None:
    head = f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: {ctype}\r\n"
    writer.write(head.encode() + extra + b"content-length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()


@contextlib.contextmanager
def running(**kwargs: object) -> Iterator[FakeUpstream]:
    with FakeUpstream(**kwargs) as upstream:  # type: ignore[arg-type]
        yield upstream
