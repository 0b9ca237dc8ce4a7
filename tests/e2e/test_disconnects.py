"""A client that leaves at any phase of its request: while sending the body, while the
upstream has not answered yet, mid-stream. Each time the exchange is finished (in-flight
gauge back to 0, the disconnect counted), the upstream request is not made or is closed at
once (so vLLM aborts it), and no task is left running in the server."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from proxy import config
from proxy.app import create_app
from proxy.server import Limits, protocol
from tests.support.fake_upstream import FakeUpstream
from tests.support.proxies import RunningProxy
from tests.support.servers import serve

CHAT = "/v1/chat/completions"


class LoopSpy:
    """ASGI wrapper that remembers the server's event loop, to list its tasks."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.loop = asyncio.get_running_loop()
        await self.app(scope, receive, send)

    def tasks(self) -> list[str]:
        assert self.loop is not None

        async def names() -> list[str]:
            me = asyncio.current_task()
            return sorted(t.get_coro().__qualname__ for t in asyncio.all_tasks() if t is not me)  # type: ignore[union-attr]

        return asyncio.run_coroutine_threadsafe(names(), self.loop).result(5)


# The proxy's own server tells the app its client left (proxy.server.CLIENT_GONE); under
# uvicorn's, the app waits for the disconnect on receive() in a task of its own.
@pytest.fixture(params=["proxy server", "uvicorn server"])
def proxy(
    request: pytest.FixtureRequest, fake_upstream: FakeUpstream
) -> Iterator[tuple[RunningProxy, LoopSpy]]:
    registry = CollectorRegistry()
    settings = config.load({"upstream": fake_upstream.url}, environ={})
    spy = LoopSpy(create_app(settings, registry=registry))
    http: Any = "httptools"
    if request.param == "proxy server":
        http = protocol(Limits.from_settings(settings))
    with serve(spy, http=http) as url:
        yield RunningProxy(url, registry), spy


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def head(length: int, **headers: str) -> bytes:
    lines = [f"POST {CHAT} HTTP/1.1", "host: proxy", "content-type: application/json"]
    lines += [f"content-length: {length}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chat_body(stream: bool) -> bytes:
    return json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    ).encode()


def baseline(proxy: RunningProxy, spy: LoopSpy) -> list[str]:
    """The server's tasks when idle, after one complete request."""
    with connect(proxy.url) as sock:
        sock.sendall(head(len(chat_body(False)), connection="close") + chat_body(False))
        while sock.recv(65536):
            pass
    wait(lambda: proxy.sample("prefill_proxy_in_flight_requests") == 0)
    return spy.tasks()


def wait(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.01)


def assert_finished(proxy: RunningProxy, spy: LoopSpy, idle: list[str]) -> None:
    disconnects = "prefill_proxy_client_disconnects_total"
    wait(lambda: proxy.sample(disconnects, route=CHAT) == 1)
    assert proxy.sample("prefill_proxy_in_flight_requests") == 0
    wait(lambda: spy.tasks() == idle)


def test_gone_while_sending_the_body(proxy, fake_upstream: FakeUpstream) -> None:
    running, spy = proxy
    idle = baseline(running, spy)
    with connect(running.url) as sock:
        sock.sendall(head(200_000) + b"x" * 50_000)
    assert_finished(running, spy, idle)
    assert len(fake_upstream.received) == 1  # the baseline's only: nothing was sent upstream
    assert (
        running.sample("prefill_proxy_requests_total", route=CHAT, model="unknown", status="0") == 1
    )


def test_gone_before_the_response_headers(
    request: pytest.FixtureRequest, proxy, fake_upstream: FakeUpstream
) -> None:
    running, spy = proxy
    idle = baseline(running, spy)
    body = chat_body(False)
    with connect(running.url) as sock:
        sock.sendall(head(len(body), **{"x-fault": "stall-headers"}) + body)
        wait(lambda: len(fake_upstream.received) == 2)  # the upstream has the request
        # A task waits for the client to leave only where the server does not say so.
        watching = "Downstream._wait_for_disconnect" in spy.tasks()
        assert watching == (request.node.callspec.params["proxy"] == "uvicorn server")
    assert fake_upstream.peer_closed.wait(5), "the upstream request was not closed"
    assert_finished(running, spy, idle)


def test_gone_mid_stream(proxy, fake_upstream: FakeUpstream) -> None:
    running, spy = proxy
    idle = baseline(running, spy)
    body = chat_body(True)
    with connect(running.url) as sock:
        sock.sendall(head(len(body), **{"x-fault": "stall-mid-stream"}) + body)
        received = b""
        while b"data: " not in received:
            received += sock.recv(65536)
    assert fake_upstream.peer_closed.wait(5), "the upstream stream was not closed"
    assert_finished(running, spy, idle)
