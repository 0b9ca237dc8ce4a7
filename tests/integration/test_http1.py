"""The engines' HTTP/1.1 client (proxy.http1) against scripted servers on loopback: what a
response may look like on the wire, connections kept and dropped, the pool's limits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from proxy import http1, http1_connection, pieces
from tests.support.servers import serve

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
SILENT = b""  # a reply to ``answering``: the request read, never answered


class Server:
    """A loopback server running ``handler`` per connection; counts its connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.url = ""

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await self.handler(reader, writer)
        writer.close()


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[Server]:
    server = Server(handler)
    listening = await asyncio.start_server(server._serve, "127.0.0.1", 0)
    port = listening.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        listening.close()


async def read_request(reader: asyncio.StreamReader, server: Server) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    body = await reader.readexactly(length)
    server.requests.append(head + body)
    return head


def pool(**limits: float) -> http1.Pool:
    return http1.Pool(
        int(limits.get("limit", 8)),
        limits.get("keepalive", 4.0),
        limits.get("connect", 2.0),
        limits.get("read", 5.0),
    )


async def fetch(
    connections: http1.Pool, url: str, method: str = "POST", body: bytes | None = b"{}"
) -> tuple[int, bytes]:
    target = http1.Target.parse(url + "/v1/chat/completions")
    headers = [(b"content-type", b"application/json")]
    response = await connections.request(method, target, headers, body)
    try:
        return response.status, b"".join([chunk async for chunk in response.chunks()])
    finally:
        await response.aclose()


def answering(*replies: bytes) -> Handler:
    """Answer each request on a connection with the next of ``replies`` (the last one
    again after that)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = 0
        while True:
            await read_request(reader, server_of[0])
            writer.write(replies[min(index, len(replies) - 1)])
            await writer.drain()
            index += 1

    server_of: list[Server] = []
    handle.server_of = server_of  # type: ignore[attr-defined]
    return handle


@contextlib.asynccontextmanager
async def answering_server(*replies: bytes) -> AsyncIterator[Server]:
    handler = answering(*replies)
    async with serving(handler) as server:
        handler.server_of.append(server)  # type: ignore[attr-defined]
        yield server


@pytest.mark.anyio
async def test_one_connection_serves_request_after_request() -> None:
    connections = pool()
    async with answering_server(OK) as server:
        for _ in range(3):
            assert await fetch(connections, server.url) == (200, b"{}")
    assert server.connections == 1
    request = server.requests[0]
    assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert f"host: {server.url[7:]}\r\n".encode() in request
    assert b"content-length: 2\r\n" in request and request.endswith(b"\r\n\r\n{}")
    connections.close()


@pytest.mark.anyio
async def test_chunked_bodies_are_read_whole_and_the_connection_kept() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )
    connections = pool()
    async with answering_server(chunked) as server:
        assert await fetch(connections, server.url) == (200, b"hello world")
        assert await fetch(connections, server.url) == (200, b"hello world")
    assert server.connections == 1
    connections.close()


@pytest.mark.anyio
async def test_a_body_until_the_close_is_read_whole_on_a_connection_not_kept() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader, server)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nall of it")
        await writer.drain()

    connections = pool()
    async with serving(handle) as server:
        assert await fetch(connections, server.url) == (200, b"all of it")
        assert await fetch(connections, server.url) == (200, b"all of it")
    assert server.connections == 2
    connections.close()


@pytest.mark.anyio
async def test_a_head_response_has_no_body_whatever_its_length_says() -> None:
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n"
    connections = pool()
    async with answering_server(head) as server:
        assert await fetch(connections, server.url, "HEAD", None) == (200, b"")
        assert await fetch(connections, server.url, "HEAD", None) == (200, b"")
    assert server.requests[0].startswith(b"HEAD ") and b"content-length" not in server.requests[0]
    connections.close()


@pytest.mark.anyio
async def test_an_interim_100_continue_is_not_the_answer() -> None:
    connections = pool()
    async with answering_server(b"HTTP/1.1 100 Continue\r\n\r\n" + OK) as server:
        assert await fetch(connections, server.url) == (200, b"{}")
        assert await fetch(connections, server.url) == (200, b"{}")
    assert server.connections == 1
    connections.close()


@pytest.mark.anyio
async def test_a_kept_connection_the_engine_drops_is_retried_only_when_idempotent() -> None:
    """The engine answers one request per connection and drops the next unanswered (a
    keep-alive it was closing): a GET goes again on a new connection; a POST, a generation
    that may have started, is the caller's error."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader, server)
        writer.write(OK)
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")
        writer.transport.abort()

    connections = pool()
    async with serving(handle) as server:
        assert await fetch(connections, server.url, "GET", None) == (200, b"{}")
        assert await fetch(connections, server.url, "GET", None) == (200, b"{}")
        assert server.connections == 2
        with pytest.raises(http1.ProtocolError):
            await fetch(connections, server.url)
        assert server.connections == 2
    connections.close()


@pytest.mark.anyio
async def test_the_read_timeout_counts_from_the_last_bytes() -> None:
    """Bytes every 0.05 s keep a 0.3 s read timeout from firing; then silence trips it."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader, server)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        for _ in range(12):
            writer.write(b"1\r\nx\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
        await reader.read()  # silent until the client gives up

    connections = pool(read=0.3)
    async with serving(handle) as server:
        target = http1.Target.parse(server.url + "/v1/chat/completions")
        response = await connections.request("POST", target, [], b"{}")
        received = b""
        with pytest.raises(http1.ReadTimeout):
            async for chunk in response.chunks():
                received += chunk
        await response.aclose()
    assert received == b"x" * 12
    connections.close()


@pytest.mark.anyio
async def test_the_read_timeout_still_fires_on_a_connection_idle_past_it() -> None:
    """The timer a response leaves pending fires while the connection is idle; the next
    request on the connection must have one of its own."""
    connections = pool(read=0.2)
    async with answering_server(OK, SILENT) as server:
        assert await fetch(connections, server.url) == (200, b"{}")
        await asyncio.sleep(0.4)  # idle past the read timeout: the pending timer fires
        async with asyncio.timeout(3):  # no timer at all: this bound trips instead
            with pytest.raises(http1.ReadTimeout):
                await fetch(connections, server.url)
    assert server.connections == 1
    connections.close()


@pytest.mark.anyio
async def test_a_deadline_nearer_than_the_read_timeout_brings_the_timer_forward() -> None:
    """A connection reused with its 30 s read timer pending: a request due in 0.2 s gets
    HeadTimeout then, not half a minute later."""
    connections = pool(read=30)
    async with answering_server(OK, SILENT) as server:
        assert await fetch(connections, server.url) == (200, b"{}")
        target = http1.Target.parse(server.url + "/v1/chat/completions")
        due = asyncio.get_running_loop().time() + 0.2
        async with asyncio.timeout(3):  # the 30 s timer only: this bound trips instead
            with pytest.raises(http1.HeadTimeout):
                await connections.request("POST", target, [], b"{}", due)
    assert server.connections == 1
    connections.close()


@pytest.mark.anyio
async def test_a_head_trickled_under_the_read_timeout_still_ends_at_the_deadline() -> None:
    """A byte of the head every 0.05 s never lets a 0.3 s read timeout fire; the deadline
    ends the wait for the rest."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader, server)
        for byte in OK[:60]:  # 3 s of head; the deadline comes first
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(OK[60:])
        await reader.read()

    connections = pool(read=0.3)
    async with serving(handle) as server:
        target = http1.Target.parse(server.url + "/v1/chat/completions")
        due = asyncio.get_running_loop().time() + 0.6
        with pytest.raises(http1.HeadTimeout):
            await connections.request("POST", target, [], b"{}", due)
    connections.close()


@pytest.mark.anyio
async def test_the_pool_limit_waits_for_a_connection_within_the_connect_timeout() -> None:
    connections = pool(limit=1, connect=0.3)
    async with answering_server(OK) as server:
        target = http1.Target.parse(server.url + "/v1/chat/completions")
        held = await connections.request("POST", target, [], b"{}")
        with pytest.raises(TimeoutError):
            await connections.request("POST", target, [], b"{}")
        waiting = asyncio.ensure_future(fetch(connections, server.url))
        await asyncio.sleep(0)
        assert not waiting.done()
        assert [chunk async for chunk in held.chunks()] == [b"{}"]
        await held.aclose()  # its connection goes to the one waiting
        assert await waiting == (200, b"{}")
    assert server.connections == 1
    connections.close()


@pytest.mark.anyio
async def test_a_big_body_arrives_intact_through_paused_reading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Reading paused past 16 KB held, not 1 MB.
    monkeypatch.setattr(http1_connection, "BUFFERED", 16 << 10)
    body = bytes(range(256)) * (16 << 10)  # 4 MB

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader, server)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()

    connections = pool()
    async with serving(handle) as server:
        target = http1.Target.parse(server.url + "/x")
        response = await connections.request("GET", target, [], None)
        received = []
        async with asyncio.timeout(10):  # reading paused for good would hang here
            async for chunk in response.chunks():
                received.append(chunk)
                await asyncio.sleep(0)  # a slow reader: the server's bytes pile up
        await response.aclose()
    assert b"".join(received) == body
    connections.close()


@pytest.mark.anyio
async def test_a_body_in_pieces_arrives_as_their_bytes_in_order() -> None:
    """Views of the client's body and encoded parts around them, written without being
    joined: 4 MB, more than a socket takes at once, so the rest waits in the transport
    as the pieces it was given."""
    history = bytes(range(256)) * (16 << 10)
    view = memoryview(history)
    parts = [b'{"messages":[', view[: 1 << 20], b",", b'"new"', b",", view[1 << 20 :], b"]}"]
    body = pieces.Pieces(parts)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader, server)
        writer.write(OK)
        await writer.drain()

    connections = pool()
    async with serving(handle) as server:
        target = http1.Target.parse(server.url + "/v1/chat/completions")
        response = await connections.request("POST", target, [], body)
        await response.aclose()
    head, _, sent = server.requests[0].partition(b"\r\n\r\n")
    assert b"content-length: %d" % len(b"".join(parts)) in head
    assert sent == b"".join(parts)
    connections.close()


@pytest.mark.anyio
async def test_what_is_not_http_and_what_is_not_there_are_errors() -> None:
    connections = pool()
    async with answering_server(b"SSH-2.0-OpenSSH\r\n\r\n") as server:
        with pytest.raises(http1.ProtocolError):
            await fetch(connections, server.url)
    async with answering_server(OK) as server:
        url = server.url
    with pytest.raises(http1.ConnectError):
        await fetch(connections, url)  # nothing listens there any more
    connections.close()


def test_targets_keep_the_path_as_written() -> None:
    target = http1.Target.parse("http://[::1]:8000/v1/models%2Fx?a=b%20c")
    assert target.origin == http1.Origin("http", "::1", 8000, b"[::1]:8000")
    assert target.path == b"/v1/models%2Fx?a=b%20c"
    assert http1.Target.parse("https://engine/v1").origin.port == 443
    with pytest.raises(ValueError):
        http1.Target.parse("ftp://engine/")


class Bodies:
    """An ASGI app (what vLLM serves with: uvicorn, httptools) that answers each request
    with its body, and keeps every body it read to the end."""

    def __init__(self) -> None:
        self.whole: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        parts, more = [], True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            parts.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(parts)
        self.whole.append(body)
        headers = [(b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@pytest.mark.anyio
async def test_a_body_begun_early_reaches_uvicorn_whole_and_one_dropped_never_does() -> None:
    """Begun on a kept-alive connection only (none idle: not begun), the rest written
    later: the app reads one body. Dropped before its end: the app reads none, and the
    pool goes on."""
    app = Bodies()
    connections = pool()
    first, rest = bytes(range(256)) * 1024, b'{"more": "bytes"}'
    with serve(app) as url:
        target = http1.Target.parse(url + "/v1/chat/completions")
        headers = [(b"content-type", b"application/json")]
        assert connections.begin("POST", target, headers, first) is None  # nothing idle
        assert await fetch(connections, url, body=b"{}") == (200, b"{}")
        upload = connections.begin("POST", target, headers, pieces.Pieces([first]))
        assert upload is not None and upload.writable()
        response = await upload.finish(rest)
        assert response.status == 200
        assert b"".join([chunk async for chunk in response.chunks()]) == first + rest
        await response.aclose()
        dropped = connections.begin("POST", target, headers, first)
        assert dropped is not None
        dropped.abort()
        assert await fetch(connections, url, body=b"after") == (200, b"after")
        empty = connections.begin("POST", target, headers, first)  # nothing more to write
        assert empty is not None
        response = await empty.finish(b"")
        assert b"".join([chunk async for chunk in response.chunks()]) == first
        await response.aclose()
    assert app.whole == [b"{}", first + rest, b"after", first]
    connections.close()
