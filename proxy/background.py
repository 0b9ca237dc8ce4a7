"""Run an ASGI app under uvicorn in a background thread, on a loopback port (demo, tests)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import uvicorn


def listening_socket(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A socket already bound and listening: clients can connect (they queue in the
    backlog) before the server loop runs, so callers need no start-up wait."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    return sock


@contextlib.contextmanager
def serve(app: Any, **uvicorn_options: Any) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1; yields its base URL; stops the server on exit."""
    sock = listening_socket()
    config = uvicorn.Config(
        app,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        server_header=False,
        date_header=False,
        **uvicorn_options,
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
