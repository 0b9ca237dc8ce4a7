"""How request bodies reach the app through the proxy's server protocol (proxy/server.py),
on a real uvicorn server and raw sockets: a body of declared length within max_body_bytes
as one message once it is all in; a chunked body, or one over the limit, in uvicorn's
pieces; a client leaving halfway seen as gone either way. An app that records what it
receives stands for the proxy (every route reads its body whole)."""

from __future__ import annotations

import queue
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from proxy.server import Limits, protocol
from tests.support.servers import serve

LIMITS = Limits(
    max_header_bytes=8192,
    max_header_count=20,
    head_timeout=5,
    body_timeout=5,
    max_client_connections=4,
    max_body_bytes=2 << 20,
)
# Bigger than one socket read (256 KB), so it arrives in several pieces.
BODY = bytes(range(256)) * 4096  # 1 MB


class Recorder:
    """An ASGI app that reads the request body to its end and answers with how many
    messages it took; every message it received goes to ``messages``."""

    def __init__(self) -> None:
        self.messages: queue.Queue[dict[str, Any]] = queue.Queue()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        count, more = 0, True
        while more:
            message = await receive()
            self.messages.put(message)
            if message["type"] == "http.disconnect":
                return
            count, more = count + 1, message.get("more_body", False)
        answer = b"%d" % count
        headers = [(b"content-length", b"%d" % len(answer))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": answer})

    def received(self) -> list[dict[str, Any]]:
        """Every message of one request, up to its last (or the client gone)."""
        found = [self.messages.get(timeout=10)]
        while found[-1]["type"] == "http.request" and found[-1].get("more_body"):
            found.append(self.messages.get(timeout=10))
        return found


@pytest.fixture
def app() -> Recorder:
    return Recorder()


@pytest.fixture
def address(app: Recorder) -> Iterator[tuple[str, int]]:
    with serve(app, http=protocol(LIMITS)) as url:
        host, port = url.removeprefix("http://").split(":")
        yield host, int(port)


def send_pieces(sock: socket.socket, head: bytes, body: bytes, piece: int = 64 << 10) -> None:
    sock.sendall(head)
    for start in range(0, len(body), piece):
        sock.sendall(body[start : start + piece])


def answer(sock: socket.socket) -> bytes:
    """The body of the server's next answer (the app says how many messages it took)."""
    got = b""
    while True:
        head, _, body = got.partition(b"\r\n\r\n")
        length = head.partition(b"content-length: ")[2].split(b"\r\n")[0]
        if length and len(body) >= int(length):
            return body
        piece = sock.recv(65536)
        assert piece, "the server closed without answering"
        got += piece


def head(length: int | None) -> bytes:
    framing = b"transfer-encoding: chunked" if length is None else b"content-length: %d" % length
    return b"POST /v1/chat/completions HTTP/1.1\r\nhost: p\r\n" + framing + b"\r\n\r\n"


def chunked(body: bytes, size: int = 100_000) -> bytes:
    pieces = [body[start : start + size] for start in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


def test_a_declared_body_within_the_limit_is_one_message(app, address) -> None:
    with socket.create_connection(address, timeout=10) as sock:
        send_pieces(sock, head(len(BODY)), BODY)
        messages = app.received()
        assert answer(sock) == b"1"  # one message
    assert [m["type"] for m in messages] == ["http.request"]
    assert messages[0]["body"] == BODY and messages[0]["more_body"] is False
    assert type(messages[0]["body"]) is bytes


@pytest.mark.parametrize("framing", ["chunked", "over the limit"])
def test_other_bodies_come_in_pieces_and_whole(app, address, framing) -> None:
    body = BODY * 3 if framing == "over the limit" else BODY
    request = head(None) + chunked(body) if framing == "chunked" else head(len(body)) + body
    with socket.create_connection(address, timeout=10) as sock:
        send_pieces(sock, b"", request)
        messages = app.received()
    assert len(messages) > 1  # uvicorn's flow control: 64 KB at a time
    assert b"".join(m["body"] for m in messages) == body


@pytest.mark.parametrize("length", [len(BODY), None])
def test_a_client_leaving_halfway_is_gone(app, address, length) -> None:
    half = BODY[: len(BODY) // 2]
    with socket.create_connection(address, timeout=10) as sock:
        send_pieces(sock, head(length), half if length else chunked(half)[:-5])
    messages = app.received()
    assert messages[-1]["type"] == "http.disconnect"


def test_keep_alive_requests_each_get_their_own_body(app, address) -> None:
    with socket.create_connection(address, timeout=10) as sock:
        for body in (BODY, b'{"a": 1}', BODY[::-1]):
            send_pieces(sock, head(len(body)), body)
            messages = app.received()
            assert b"".join(m["body"] for m in messages) == body
            assert answer(sock) == b"%d" % len(messages)
