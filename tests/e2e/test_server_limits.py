"""The server's limits (proxy/server.py) under raw sockets: heads too large or too many
headers (431), heads and bodies that never finish (408, then closed), too many
connections (503); each answer in OpenAI's shape, nothing sent upstream, the in-flight
gauge back at 0. Normal requests, keep-alive included, are untouched, and a whole
response goes out in one write."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from proxy import config
from proxy.app import create_app
from proxy.server import Limits, protocol
from tests.support.fake_upstream import FakeUpstream
from tests.support.proxies import RunningProxy
from tests.support.servers import serve

LIMITS = Limits(
    max_header_bytes=8192,
    max_header_count=20,
    head_timeout=0.5,
    body_timeout=0.5,
    max_client_connections=4,
    max_body_bytes=1 << 20,
)
CHAT = b"POST /v1/chat/completions HTTP/1.1\r\nhost: p\r\ncontent-type: application/json\r\n"


@pytest.fixture
def proxy(fake_upstream: FakeUpstream) -> Iterator[RunningProxy]:
    registry = CollectorRegistry()
    settings = config.load({"upstream": fake_upstream.url}, environ={})
    with serve(create_app(settings, registry=registry), http=protocol(LIMITS)) as url:
        yield RunningProxy(url, registry)


def connect(proxy: RunningProxy) -> socket.socket:
    host, port = proxy.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def answer(sock: socket.socket) -> tuple[int, dict]:
    """The status and JSON body of the one response before the server closes."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_a_head_over_the_byte_limit_gets_431(proxy, fake_upstream) -> None:
    with connect(proxy) as sock:
        sock.sendall(CHAT + b"x-big: " + b"a" * 100_000)  # never ends its head, either
        status, body = answer(sock)
    assert status == 431 and "8192 bytes" in body["error"]["message"]
    assert fake_upstream.received == []


def test_a_client_still_sending_after_a_refusal_reads_the_answer(proxy) -> None:
    # Closing at once with the client's data unread resets the connection, and the answer
    # in flight is lost; the server lingers instead (RFC 9112, 9.6): it reads and drops
    # what still comes until the client is done, then closes.
    with connect(proxy) as sock:
        sock.sendall(CHAT + b"x-big: " + b"a" * 100_000)
        for _ in range(32):  # 2 MB more: a reset connection refuses them
            sock.sendall(b"a" * 65536)
        sock.shutdown(socket.SHUT_WR)
        status, body = answer(sock)
    assert status == 431 and "8192 bytes" in body["error"]["message"]


def test_too_many_headers_get_431(proxy, fake_upstream) -> None:
    many = b"".join(b"x-h%d: v\r\n" % i for i in range(30))
    with connect(proxy) as sock:
        sock.sendall(CHAT + many + b"content-length: 2\r\n\r\n{}")
        status, body = answer(sock)
    assert status == 431 and "over 20 headers" in body["error"]["message"]
    assert fake_upstream.received == []


def test_a_head_that_never_ends_gets_408_and_is_closed(proxy) -> None:
    with connect(proxy) as sock:
        sock.sendall(CHAT)  # no blank line: the head is never complete
        started = time.monotonic()
        status, body = answer(sock)
        waited = time.monotonic() - started
    assert status == 408 and body["error"]["code"] == 408
    assert waited < 5  # head_timeout 0.5 s: closed, not held forever
    with connect(proxy) as idle:  # a connection that sends nothing at all, too
        assert answer(idle)[0] == 408


def test_a_body_that_never_ends_gets_408_and_the_exchange_finishes(proxy, fake_upstream) -> None:
    with connect(proxy) as sock:
        sock.sendall(CHAT + b"content-length: 1000\r\n\r\n" + b'{"model": "m"')
        status, _ = answer(sock)
    assert status == 408
    proxy.wait_for(lambda: proxy.sample("prefill_proxy_in_flight_requests") == 0)
    assert fake_upstream.received == []


def test_one_connection_over_the_cap_gets_503(proxy) -> None:
    held = [connect(proxy) for _ in range(LIMITS.max_client_connections)]
    try:
        for sock in held:  # each is accepted: one byte of a head keeps it from timing out
            sock.sendall(b"P")
        with connect(proxy) as extra:
            status, body = answer(extra)
        assert status == 503 and "client connections" in body["error"]["message"]
    finally:
        for sock in held:
            sock.close()


def test_normal_requests_and_keep_alive_are_untouched(proxy) -> None:
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        for _ in range(3):  # one connection, kept alive between them
            assert client.post("/v1/chat/completions", json=request).status_code == 200
            time.sleep(0.6)  # longer than head_timeout between requests: still fine
    assert proxy.sample("prefill_proxy_in_flight_requests") == 0


class Writes:
    """A connection's real transport, with what was written to it, call by call."""

    def __init__(self, transport: Any, calls: list[bytes]) -> None:
        self._transport, self.calls = transport, calls

    def write(self, data: bytes) -> None:
        self.calls.append(bytes(data))
        self._transport.write(data)

    def writelines(self, parts: Any) -> None:
        self.write(b"".join(parts))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def test_a_whole_response_goes_out_in_one_write(fake_upstream: FakeUpstream) -> None:
    # uvicorn writes the head and the body apart: two syscalls, two wake-ups of the client.
    calls: list[bytes] = []

    class Counted(protocol(LIMITS)):  # type: ignore[misc,valid-type]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(Writes(transport, calls))

    settings = config.load({"upstream": fake_upstream.url}, environ={})
    app = create_app(settings, registry=CollectorRegistry())
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with serve(app, http=Counted) as url, httpx.Client(base_url=url, timeout=10) as client:
        for _ in range(2):  # the second on the kept-alive connection
            reply = client.post("/v1/chat/completions", json=request)
            assert reply.status_code == 200 and reply.json()["choices"]
    assert len(calls) == 2, [call[:40] for call in calls]
    assert all(call.startswith(b"HTTP/1.1 200") and call.endswith(reply.content) for call in calls)


def test_a_response_before_a_close_is_written_whole(proxy) -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    head = CHAT + b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(body)
    with connect(proxy) as sock:  # the server closes right after the response: it waits
        sock.sendall(head + body)
        status, reply = answer(sock)
    assert status == 200 and reply["choices"][0]["message"]["content"]
