"""Podman for the deploy tests: the tools, a stand-in for the base image, the real image.

No Docker engine and no registry pulls here, so: podman with the runc runtime (crun fails
on this machine's cgroup setup), host networking, and ``python:3.11-slim`` replaced by a
debootstrap of Debian bookworm with its python3.11 (the same Debian release and Python
minor version), built once and cached in podman's own storage. The project's Dockerfile
is then built unchanged against it (``--from``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

from tests.support.debian import require

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("PREFILL_PROXY_CACHE", Path.home() / ".cache" / "prefill-proxy"))
BASE_IMAGE = "localhost/prefill-proxy-pybase:3.11-bookworm"
IMAGE = "localhost/prefill-proxy:test"
# Binary -> the Debian package that ships it (tests/deploy/install_tools.sh installs them).
TOOLS = {"podman": "podman", "runc": "runc", "debootstrap": "debootstrap"}
# Podman's default RLIMIT_NOFILE is refused inside this sandbox: no default ulimits.
CONTAINERS_CONF = "[containers]\ndefault_ulimits = []\n"


@dataclasses.dataclass(frozen=True)
class Podman:
    """``podman --runtime runc`` with the suite's containers.conf."""

    conf: Path

    @classmethod
    def create(cls, folder: Path) -> Podman:
        require(TOOLS)
        conf = folder / "containers.conf"
        conf.write_text(CONTAINERS_CONF)
        return cls(conf)

    def run(
        self, *args: str, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["podman", "--runtime", "runc", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "CONTAINERS_CONF": str(self.conf)},
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"podman {' '.join(args)} exited {result.returncode}:\n"
                f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
        return result

    def exists(self, image: str) -> bool:
        return self.run("image", "exists", image, check=False).returncode == 0

    def image_size(self, image: str) -> int:
        return int(self.run("image", "inspect", "--format", "{{.Size}}", image).stdout)


def ensure_base_image(podman: Podman) -> str:
    """The stand-in for python:3.11-slim, built on first use (~1 min) and kept."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".pybase.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not podman.exists(BASE_IMAGE):
            _build_base_image(podman)
    return BASE_IMAGE


def _build_base_image(podman: Podman) -> None:
    with tempfile.TemporaryDirectory(dir=CACHE, prefix="pybase-") as folder:
        root = Path(folder) / "root"
        result = subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=python3,python3-pip,python3-venv,ca-certificates",
                "bookworm",
                str(root),
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert result.returncode == 0, f"debootstrap failed:\n{result.stdout[-3000:]}"
        # As in python:3.11-slim: pip installs into the system Python, `python` and `pip`
        # exist; no apt lists or caches in the image.
        (root / "usr/lib/python3.11/EXTERNALLY-MANAGED").unlink(missing_ok=True)
        for name, target in (("python", "/usr/bin/python3"), ("pip", "/usr/bin/pip3")):
            (root / "usr/local/bin" / name).symlink_to(target)
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(root / junk, ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            ["podman", "--runtime", "runc", "import", "-", BASE_IMAGE],
            stdin=tar.stdout,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "CONTAINERS_CONF": str(podman.conf)},
        )
        tar.wait()
        assert imported.returncode == 0, imported.stderr


@dataclasses.dataclass(frozen=True)
class Build:
    image: str
    seconds: float
    size_bytes: int


def build_image(podman: Podman) -> Build:
    """The project's Dockerfile, unchanged, on the stand-in base. The host's CA bundle is
    mounted for the build: the package registry is reached through a proxy whose
    certificate is in this machine's bundle."""
    base = ensure_base_image(podman)
    started = time.monotonic()
    podman.run(
        "build",
        "--network=host",
        "--format=docker",  # keeps HEALTHCHECK (the OCI format drops it)
        "-v",
        "/etc/ssl/certs:/etc/ssl/certs:ro",
        "--from",
        base,
        "-t",
        IMAGE,
        str(ROOT),
        timeout=900,
    )
    return Build(IMAGE, time.monotonic() - started, podman.image_size(IMAGE))


ENGINE_IMAGE = "localhost/prefill-proxy-engine:test"
# Test-only: the project's image plus the simulator, which the image leaves out (it ships
# serve alone), to stand in for vLLM where its image cannot be pulled.
ENGINE_CONTAINERFILE = """\
FROM {image}
USER 0
COPY sim /tmp/sim
RUN pip install --no-cache-dir jinja2=={jinja2} \\
    && cp -r /tmp/sim "$(python -c 'import proxy; print(proxy.__path__[0])')/sim" \\
    && rm -rf /tmp/sim
USER 10001
"""


def build_engine_image(podman: Podman, image: Build) -> str:
    with tempfile.TemporaryDirectory() as folder:
        context = Path(folder)
        shutil.copytree(ROOT / "proxy" / "sim", context / "sim")
        containerfile = ENGINE_CONTAINERFILE.format(
            image=image.image, jinja2=metadata.version("jinja2")
        )
        (context / "Containerfile").write_text(containerfile)
        podman.run(
            "build",
            "--network=host",
            "-v",
            "/etc/ssl/certs:/etc/ssl/certs:ro",
            "-t",
            ENGINE_IMAGE,
            str(context),
            timeout=600,
        )
    return ENGINE_IMAGE


@contextlib.contextmanager
def running(podman: Podman, *args: str, name: str) -> Iterator[str]:
    """``podman run -d --network=host ARGS`` for the block; removed afterwards."""
    podman.run("rm", "-f", name, check=False)
    podman.run("run", "-d", "--name", name, "--network=host", *args)
    try:
        yield name
    finally:
        podman.run("rm", "-f", "-t", "0", name, check=False)


def wait_until(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.1)
