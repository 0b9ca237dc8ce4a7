"""``prefill-proxy serve`` as a user runs it: a real process, configured by file, environment
and flags; one JSON log line per request, without prompt text or secrets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support.servers import listening_socket

SECRET = "sk-do-not-log-me"
PROMPT = "the prompt text must not reach the logs"


def free_port() -> int:
    with listening_socket() as sock:
        return sock.getsockname()[1]


def wait_healthy(url: str, process: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.05)
    raise AssertionError("proxy did not become healthy")


def test_serve_command(fake_upstream, tmp_path: Path) -> None:
    port = free_port()
    config = tmp_path / "proxy.yaml"
    config.write_text("upstream: http://127.0.0.1:1\nport: 1\nmax_body_bytes: 5000\n")
    env = {
        **os.environ,
        "PREFILL_PROXY_UPSTREAM": fake_upstream.url,
        "PREFILL_PROXY_CONFIG": str(config),
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--port", str(port), "--host", "127.0.0.1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, process)
        with httpx.Client(base_url=url, headers={"authorization": f"Bearer {SECRET}"}) as client:
            chat = {"model": "m", "messages": [{"role": "user", "content": PROMPT}]}
            assert client.post("/v1/chat/completions", json=chat).status_code == 200
            assert client.post("/v1/chat/completions", content=b"x" * 6000).status_code == 413
    finally:
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    assert fake_upstream.received[0].header("authorization") == f"Bearer {SECRET}"
    for output in (stdout, stderr):
        assert SECRET not in output and PROMPT not in output
    # The access log is stdout, one bare JSON object a line; diagnostics stay on stderr.
    lines = [json.loads(line) for line in stdout.splitlines()]
    assert "prefill_proxy.access" not in stderr
    assert [line["status"] for line in lines] == [200, 413]
    first = lines[0]
    assert first["route"] == "/v1/chat/completions" and first["model"] == "m"
    assert (first["prompt_tokens"], first["cached_tokens"], first["completion_tokens"]) == (
        40,
        32,
        3,
    )
    assert first["rewrites"] == [] and first["overhead_ms"] >= 0


def test_bad_setting_exits_with_a_clear_message() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--port", "eighty"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "PREFILL_PROXY_CONFIG": ""},
    )
    assert result.returncode == 2
    assert "port" in result.stderr and "Traceback" not in result.stderr


def test_sigterm_ends_a_never_ending_stream_after_the_grace_period(fake_upstream) -> None:
    """A stream that would never end (the upstream stalls) gets an error event once the
    shutdown grace is over, and the process exits by itself."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--port", str(port)],
        env={
            **os.environ,
            "PREFILL_PROXY_UPSTREAM": fake_upstream.url,
            "PREFILL_PROXY_SHUTDOWN_GRACE": "1",
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, process)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    lines = []
    with httpx.stream(
        "POST",
        url + "/v1/chat/completions",
        json=body,
        headers={"x-fault": "stall-mid-stream"},
        timeout=30,
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                lines.append(line[6:])
            if len(lines) == 2:  # the stream is under way and stalls here
                process.send_signal(signal.SIGTERM)
                stopped = time.monotonic()
        # the rest of the stream: the error event, then the end
    took = time.monotonic() - stopped
    # uvicorn re-raises SIGTERM once it has shut down: the exit status of a SIGTERM.
    assert process.wait(30) in (0, -signal.SIGTERM), process.stderr.read() if process.stderr else ""
    assert lines[-1] == "[DONE]" and json.loads(lines[-2])["error"]["code"] == "shutting_down"
    print(f"\nstream ended {took:.2f} s after SIGTERM (grace 1 s)")
    assert fake_upstream.peer_closed.wait(5)  # the upstream request was closed too
