"""Fixtures of the deploy tests that run real tools: podman with the project's image, and
a simulator on a loopback port for the containers (host network) to proxy to."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from proxy.background import free_port, spawn
from tests.support.podman import Build, Podman, build_image


@pytest.fixture(scope="session")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    return Podman.create(tmp_path_factory.mktemp("podman"))


@pytest.fixture(scope="session")
def image(podman: Podman) -> Build:
    """The project's image, built once per run from the Dockerfile (layers cached by podman)."""
    build = build_image(podman)
    print(f"\nimage {build.image}: built in {build.seconds:.1f} s, {build.size_bytes / 1e6:.0f} MB")
    return build


@pytest.fixture(scope="session")
def simulator() -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with spawn(["proxy", "sim", "--port", str(port), "--speed", "50"], url + "/health"):
        yield url
