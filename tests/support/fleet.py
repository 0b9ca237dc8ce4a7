"""A scale-out deployment on loopback, all real processes: simulators as engines, proxy
replicas (``prefill-proxy serve``) sharing a valkey-server, nginx in front choosing a
replica at random per request. Engines and the store can be killed and restarted."""

from __future__ import annotations

import contextlib
import re
import subprocess
import urllib.request
from collections.abc import Iterator, Sequence

from proxy.background import free_port, spawn
from tests.support.nginx import balancer
from tests.support.valkey import Valkey

_COMPUTED = re.compile(
    rb'^vllm:prompt_tokens_by_source_total\{[^}]*source="local_compute"[^}]*\} ([0-9.e+]+)$',
    re.M,
)


class Engine:
    """``prefill-proxy sim`` in a process of its own, killable, on a fixed port."""

    def __init__(self, speed: float = 50.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._speed = speed
        self._stack = contextlib.ExitStack()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = ["proxy", "sim", "--port", str(self.port), "--speed", str(self._speed)]
        command += ["--log-level", "warning"]
        self.process = self._stack.enter_context(spawn(command, self.url + "/health"))

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
        self._stack.close()
        self.process = None

    def computed_tokens(self) -> float:
        """Prompt tokens this engine computed (not served from its prefix cache)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as response:
            return sum(float(v) for v in _COMPUTED.findall(response.read()))


def proxy_command(port: int, engines: Sequence[str], store_url: str, *extra: str) -> list[str]:
    return [
        "proxy", "serve",
        "--port", str(port),
        "--upstream", ",".join(engines),
        "--session-store", "redis",
        "--redis-url", store_url,
        "--engine-probe-interval", "0.2",
        "--log-level", "warning",
        *extra,
    ]  # fmt: skip


@contextlib.contextmanager
def replicas(count: int, engines: Sequence[str], store: Valkey, *extra: str) -> Iterator[list[str]]:
    """``count`` proxy replicas in front of ``engines``, sharing ``store``; their URLs."""
    with contextlib.ExitStack() as stack:
        urls = []
        for _ in range(count):
            port = free_port()
            command = proxy_command(port, engines, store.url, *extra)
            stack.enter_context(spawn(command, f"http://127.0.0.1:{port}/health"))
            urls.append(f"http://127.0.0.1:{port}")
        yield urls


@contextlib.contextmanager
def fleet(
    proxies: int, engines: Sequence[Engine], store: Valkey, *extra: str
) -> Iterator[tuple[str, list[str]]]:
    """(the balancer's URL, the replicas' URLs)."""
    with (
        replicas(proxies, [e.url for e in engines], store, *extra) as urls,
        balancer(urls) as front,
    ):
        yield front, urls


def scrape(url: str) -> bytes:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as response:
        return bytes(response.read())


def counter(text: bytes, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    total = 0.0
    for line in text.decode().splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total
