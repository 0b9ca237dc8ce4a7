"""The proxy's HTTP server protocol: uvicorn's httptools protocol with the limits a proxy at
the edge needs, enforced before the app sees a request.

- The request head (request line and headers) is bounded in bytes (counted as it arrives,
  so a 100 MB header value is refused after ``max_header_bytes``, not parsed) and in
  header count: 431.
- A client has ``head_timeout`` seconds to send its head (from connecting, or from the
  end of its previous response) and ``body_timeout`` seconds for the body after it: 408,
  then the connection is closed (a request that never finishes holds no socket forever).
- At most ``max_client_connections`` at once: one more gets a 503 and is closed.

The head of a whole response waits for the end of the loop's step (``Corked``): its
head and body are one syscall, and one wake-up of the client, not two.

A request's scope carries ``CLIENT_GONE``: the app hands it a callback, called if the
connection is lost before the response is complete. Without it, an app that must stop when
its client leaves keeps a task waiting on ``receive()`` for the disconnect: a task, an
event and two wake-ups on every request, about 15 us of the 64 KB step at c=64.

A body whose declared length is within ``max_body_bytes`` (every route reads its body
whole, up to that) is gathered here and handed to the app as one message when it is all
in: uvicorn's own way pauses reading at every 64 KB and wakes the app for each piece,
which then joins them; on a 1 MB agent step that was three copies of the body and a
dozen wake-ups on the request path. A longer or chunked body goes uvicorn's way.

Refusals are OpenAI-style JSON, like every other error of the proxy, and end with a
lingering close (RFC 9112, section 9.6): the server stops writing, then reads and drops
what the client still sends until it closes too, for up to LINGER_S. Closing at once with
unread data makes the kernel reset the connection, and a client still sending its head or
body then loses the answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from proxy import jsonio
from proxy.config import Settings
from proxy.downstream import CLIENT_GONE
from proxy.errors import error_body

log = logging.getLogger("prefill_proxy.server")

_REASONS = {
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


@dataclasses.dataclass(frozen=True)
class Limits:
    max_header_bytes: int
    max_header_count: int
    head_timeout: float
    body_timeout: float
    max_client_connections: int
    max_body_bytes: int

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            settings.max_header_bytes,
            settings.max_header_count,
            settings.head_timeout,
            settings.body_timeout,
            settings.max_client_connections,
            settings.max_body_bytes,
        )


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request that is refused (httptools
    turns it into a parser error, which uvicorn answers with a 400 we keep back)."""


def protocol(limits: Limits) -> type[HttpToolsProtocol]:
    """uvicorn's ``http`` protocol class, with these limits."""
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), {"limits": limits})


# How often the deadlines of all connections are checked: a timeout fires up to this much
# late, and a request costs a float assignment instead of a timer of its own.
SWEEP_S = 0.25
# How long a refused connection is read (and what arrives dropped) before it is closed.
LINGER_S = 2.0


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    limits: Limits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = 0
        self._deadline: float | None = None  # by when the current phase must be done
        self._late = ""  # what it is, for the 408
        self._refused = False
        self._lingering = False  # refused: read and dropped until the deadline, then closed
        self._parts: list[bytes] | None = None  # a body gathered whole, as it arrives
        # Called if the connection goes before the running response is complete (one
        # request's app runs at a time: uvicorn starts a pipelined one after it).
        self._on_gone: list[Callable[[], None]] = []

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(Corked(transport, self.loop))  # type: ignore[arg-type]
        # One sweeper per server (kept on uvicorn's state, shared by its connections).
        sweeper = getattr(self.server_state, "prefill_proxy_sweeper", None)
        if sweeper is None or sweeper.done():
            sweeper = self.loop.create_task(_sweep(self.loop, self.connections))
            self.server_state.prefill_proxy_sweeper = sweeper  # type: ignore[attr-defined]
        if len(self.connections) > self.limits.max_client_connections:
            self._refuse(503, "the proxy holds as many client connections as it may")
            return
        self._due(self.limits.head_timeout, "the request head did not arrive in time")

    def connection_lost(self, exc: Exception | None) -> None:
        self._deadline = None
        super().connection_lost(exc)
        callbacks, self._on_gone = self._on_gone, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # one app's bookkeeping must not break the server's
                log.exception("client-gone callback failed")

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self.limits.max_header_bytes and not self._refused:
            self._refuse(431, f"the request head is over {self.limits.max_header_bytes} bytes")

    # Parser callbacks (httptools), around uvicorn's own.

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._due(self.limits.head_timeout, "the request head did not arrive in time")

    def on_headers_complete(self) -> None:
        self._in_head = False
        # Counted once the head is in: its bytes bound how many there can be meanwhile.
        if len(self.headers) > self.limits.max_header_count:
            self._refuse(431, f"the request has over {self.limits.max_header_count} headers")
            raise _Refused
        self._due(self.limits.body_timeout, "the request body did not arrive in time")
        super().on_headers_complete()
        # The app's task starts on the loop's next turn, and sees the scope as it is then.
        self.scope[CLIENT_GONE] = self._on_gone.append  # type: ignore[literal-required]
        length = _content_length(self.headers)
        whole = 0 < length <= self.limits.max_body_bytes and not self.parser.should_upgrade()
        self._parts = [] if whole else None

    def on_body(self, body: bytes) -> None:
        parts = self._parts
        if parts is None or self.cycle.response_complete:
            super().on_body(body)
        else:
            parts.append(body)

    def on_message_complete(self) -> None:
        self._deadline = None
        if self._parts is not None:
            # bytes, not uvicorn's bytearray: its receive() passes bytes on without a copy,
            # and a body of one message is not copied again by whoever joins the parts.
            self.cycle.body = b"".join(self._parts)  # type: ignore[assignment]
            self._parts = None
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self._on_gone.clear()
        super().on_response_complete()
        if not self.transport.is_closing():  # keep-alive: the next head is counted anew
            self._head_bytes = 0
            self._in_head = True

    def send_400_response(self, msg: str) -> None:
        if not self._refused:  # a callback that refused already answered
            super().send_400_response(msg)

    # --

    def _due(self, seconds: float, late: str) -> None:
        self._deadline, self._late = self.loop.time() + seconds, late

    def check_deadline(self, now: float) -> None:
        if self._deadline is None or now < self._deadline:
            return
        self._deadline = None
        if self._lingering:
            self.transport.close()
            return
        cycle = self.cycle
        if cycle is not None and cycle.response_started:
            self.transport.close()  # the app answers already: only the connection can go
            return
        self._refuse(408, self._late)

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` in OpenAI's shape and close (the app, if it runs, then sees the
        client gone)."""
        self._refused = True
        self._deadline = None
        body = jsonio.dumps(error_body(message, "invalid_request_error", status))
        head = b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status])
        head += b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
        head += b"connection: close\r\n\r\n"
        if not self.transport.is_closing():
            self.transport.write(head + body)
            self._linger()

    def _linger(self) -> None:
        """Stop writing, keep reading (data_received drops it) until the client closes
        (uvicorn's eof_received lets the transport close then) or LINGER_S pass."""
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self.flow.resume_reading()  # a body paused for the app is read (and dropped) too
        self._lingering = True
        self._due(LINGER_S, "")


# In a head uvicorn wrote (names in lower case): a response of known length, whose body is
# most likely written in the same step. A stream's head is not held: its first chunk
# comes later, and would only wait for the head.
_WHOLE = b"\r\ncontent-length: "
# A head and a body longer than this go out as a writev of the two, not joined first.
JOIN_BYTES = 64 << 10


class Corked:
    """A connection's transport that holds the head of a whole response until the end of
    the loop's current step: uvicorn writes a response's head and body apart, two syscalls
    and two wake-ups of the client, and the body written in the same step now goes out
    with it. Any other write goes out at once (a stream is not held at all), and a close
    or end of writing sends what waits first."""

    __slots__ = ("_head", "_loop", "transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self._loop = loop
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            if len(head) + len(data) <= JOIN_BYTES:
                self.transport.write(head + data)
            else:
                self.transport.writelines([head, data])
        elif type(data) is bytes and data.startswith(b"HTTP/") and _WHOLE in data:
            self._head = data  # the head of a whole response (uvicorn writes bytes)
            self._loop.call_soon(self.flush)
        else:
            self.transport.write(data)

    def flush(self) -> None:
        head, self._head = self._head, None
        if head is not None and not self.transport.is_closing():
            self.transport.write(head)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def write_eof(self) -> None:
        self.flush()
        self.transport.write_eof()

    def is_closing(self) -> bool:
        return self.transport.is_closing()

    def __getattr__(self, name: str) -> Any:  # the rest, as the transport has it
        return getattr(self.transport, name)


def _content_length(headers: list[tuple[bytes, bytes]]) -> int:
    """The declared body length; 0 where there is none (a chunked body: httptools refuses
    a request with both, or with a length that is not a number)."""
    for name, value in headers:
        if name == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0


async def _sweep(loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
    """Check every connection's deadline each SWEEP_S."""
    while True:
        await asyncio.sleep(SWEEP_S)
        now = loop.time()
        for connection in list(connections):
            if isinstance(connection, LimitedHttpToolsProtocol):
                connection.check_deadline(now)
