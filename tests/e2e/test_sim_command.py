"""``prefill-proxy sim`` as a user runs it: a real process on a loopback port."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx

from tests.support.servers import listening_socket


def free_port() -> int:
    with listening_socket() as sock:
        return int(sock.getsockname()[1])


def sim_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "proxy", "sim", *args]


def test_help_names_the_modelled_gpu_and_every_knob() -> None:
    result = subprocess.run(sim_command("--help"), capture_output=True, text=True, check=True)
    for text in ("Llama-3.1-8B", "H100", "--block-size", "--capacity-tokens", "--speed"):
        assert text in result.stdout
    for flag in ("--tokenizer", "--prefill-token-s", "--weights-read-s", "--max-model-len"):
        assert flag in result.stdout


def test_sim_serves_until_interrupted() -> None:
    port = free_port()
    process = subprocess.Popen(
        sim_command("--port", str(port), "--speed", "100", "--capacity-tokens", "20000"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "the simulator did not come up"
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        with httpx.Client(base_url=url, timeout=30) as client:
            models = client.get("/v1/models").json()["data"][0]
            assert models["id"] == "sim-model"
            assert models["max_model_len"] == 20000  # capped to what the KV cache holds
            chat = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}
            reply = client.post("/v1/chat/completions", json=chat).json()
            assert reply["usage"]["completion_tokens"] == 3
    finally:
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=15)
    assert process.returncode == 0, stderr
    assert "simulator on http://127.0.0.1" in stderr
    assert "Finished server process" in stderr  # a graceful shutdown: lifespan ran to its end


def test_an_impossible_configuration_is_refused_with_a_reason() -> None:
    result = subprocess.run(
        sim_command("--capacity-tokens", "1000", "--max-model-len", "4096"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "cannot hold one sequence of max_model_len=4096" in result.stderr
