"""Servers in the background on loopback ports: an ASGI app under uvicorn in a thread, or a
``python -m`` child process (demo, benchmarks, tests)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
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
    options = {
        "loop": "uvloop",
        "http": "httptools",
        "log_level": "warning",
        "access_log": False,
        "server_header": False,
        "date_header": False,
        **uvicorn_options,
    }
    config = uvicorn.Config(app, **options)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(15)
        sock.close()


def free_port() -> int:
    """A loopback port that was free a moment ago (for a child process to bind)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, process: subprocess.Popen[bytes] | None, timeout: float = 60) -> None:
    """Poll ``url`` until it answers 200; fail if the process dies or the deadline passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"exited with {process.returncode} before {url} was ready")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as response:
            if response.status == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{url} not ready within {timeout:.0f} s")


@contextlib.contextmanager
def spawn(
    args: Sequence[str], health_url: str, cwd: str | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``python -m <args>`` while the block runs, ready once ``health_url`` answers.
    Its stderr goes to a file (a pipe nobody reads would block it), shown if start-up
    fails. In its own session, so Ctrl-C reaches only the parent, which stops it."""
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(
            [sys.executable, "-m", *args],
            stdout=subprocess.DEVNULL,
            stderr=errors,
            start_new_session=True,
            cwd=cwd,
        )
        try:
            try:
                wait_ready(health_url, process)
            except RuntimeError as exc:
                errors.seek(0)
                tail = errors.read()[-2000:].decode(errors="replace")
                raise RuntimeError(f"python -m {' '.join(args)}: {exc}\n{tail}") from None
            yield process
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
