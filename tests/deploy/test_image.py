"""The container image for real: the Dockerfile built unchanged with podman (on the
stand-in base, tests/support/podman.py) and run on the host network in front of a
simulator, as the sidecar runs next to vLLM."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator

import httpx
import pytest

from proxy.background import free_port
from tests.support.podman import Build, Podman, running, wait_until

GRACE_SECONDS = 10  # podman stop's default, under Kubernetes' 30 s


def healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@contextlib.contextmanager
def start(podman: Podman, image: Build, name: str, upstream: str) -> Iterator[str]:
    port = free_port()
    env = {"PREFILL_PROXY_PORT": str(port), "PREFILL_PROXY_UPSTREAM": upstream}
    flags = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
    with running(podman, *flags, image.image, name=name):
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: healthy(url), f"{name} answering /health")
        yield url


@pytest.fixture(scope="module")
def proxy_url(podman: Podman, image: Build, simulator: str) -> Iterator[str]:
    with start(podman, image, "prefill-proxy-test", simulator) as url:
        yield url


def test_runs_as_the_unprivileged_user(podman: Podman, proxy_url: str) -> None:
    uid = podman.run("exec", "prefill-proxy-test", "id", "-u").stdout.strip()
    assert uid == "10001"
    user = podman.run("top", "prefill-proxy-test", "user", "args").stdout
    assert "prefill-proxy serve" in user and "root" not in user


def test_the_image_ships_serve_alone(podman: Podman, proxy_url: str) -> None:
    shipped = podman.run(
        "exec",
        "prefill-proxy-test",
        "python",
        "-c",
        "import importlib.util as u; print([m for m in ('proxy.chat', 'proxy.sim', "
        "'proxy.replay', 'proxy.demo', 'jinja2', 'matplotlib') if u.find_spec(m)])",
    ).stdout.strip()
    assert shipped == "['proxy.chat']"
    refused = podman.run("exec", "prefill-proxy-test", "prefill-proxy", "sim", check=False)
    assert refused.returncode == 2 and "not part of this installation" in refused.stderr


def test_health_and_ready_against_the_engine(proxy_url: str) -> None:
    assert httpx.get(proxy_url + "/health", timeout=5).status_code == 200
    assert httpx.get(proxy_url + "/ready", timeout=5).status_code == 200


def test_streamed_chat_with_usage_and_its_access_line(podman: Podman, proxy_url: str) -> None:
    body = {
        "model": "sim-model",
        "messages": [{"role": "user", "content": "Say hello."}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 8,
    }
    with httpx.stream("POST", proxy_url + "/v1/chat/completions", json=body, timeout=30) as reply:
        assert reply.status_code == 200
        events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert len(usage) == 1 and usage[0]["completion_tokens"] > 0
    assert "".join(choice["delta"].get("content") or "" for c in chunks for choice in c["choices"])

    def access_line() -> dict[str, object] | None:
        stdout = podman.run("logs", "prefill-proxy-test").stdout
        lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
        streamed = [line for line in lines if line.get("stream")]
        return streamed[-1] if streamed else None

    wait_until(lambda: access_line() is not None, "the access line on the container's stdout")
    line = access_line()
    assert line is not None
    assert line["route"] == "/v1/chat/completions" and line["status"] == 200
    assert line["prompt_tokens"] == usage[0]["prompt_tokens"]
    assert "Say hello" not in podman.run("logs", "prefill-proxy-test").stdout


def test_stops_within_the_grace_period_on_sigterm(podman: Podman, image: Build) -> None:
    """Against an engine that is not there: live, not ready, and it still stops cleanly."""
    name = "prefill-proxy-sigterm"
    with start(podman, image, name, f"http://127.0.0.1:{free_port()}") as url:
        assert httpx.get(url + "/ready", timeout=5).status_code == 503
        with httpx.Client(base_url=url) as idle:  # a kept-alive client connection
            assert idle.get("/health").status_code == 200
            started = time.monotonic()
            podman.run("stop", "-t", str(GRACE_SECONDS), name, timeout=GRACE_SECONDS + 30)
            took = time.monotonic() - started
        state = podman.run("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip()
        print(f"\nstopped in {took:.2f} s, exit code {state}")
        assert took < GRACE_SECONDS and state == "0"  # exited by itself, not SIGKILLed
