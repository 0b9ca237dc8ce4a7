"""Run an ASGI app under a real uvicorn server on a loopback port, in a thread."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import uvicorn


def listening_socket() -> socket.socket:
    """A socket already bound and listening: clients can connect (they queue in the
    backlog) before the server loop runs, so no start-up wait is needed."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    return sock


@contextlib.contextmanager
def serve(app: object, **uvicorn_options: object) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1; yields its base URL; stops the server on exit."""
    sock = listening_socket()
    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        server_header=False,
        date_header=False,
        **uvicorn_options,  # type: ignore[arg-type]
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()
