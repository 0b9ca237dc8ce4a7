"""The README's demo command in a copy of the repository with nothing beside it, as a new
user runs it after `git clone` (.ci/run does the same for the test command)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_command(comment: str) -> str:
    """The command under ``# <comment>`` in the README's Quickstart block."""
    text = (ROOT / "README.md").read_text()
    match = re.search(rf"^# {re.escape(comment)}.*\n(?:#.*\n)*(\S.*)$", text, re.MULTILINE)
    assert match, f"no command under '# {comment}' in README.md"
    return match.group(1)


def fresh_copy(folder: Path) -> Path:
    """What a commit of this working tree holds (tracked files and untracked ones git does
    not ignore), alone in ``folder``: no venv, no caches, no shared/ beside it."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    clone = folder / "prefill-proxy"
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():  # a file deleted but not yet committed is not there
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, clone / name)
    assert [p.name for p in folder.iterdir()] == ["prefill-proxy"]
    return clone


def test_the_readme_demo_command_runs_in_a_fresh_clone(tmp_path: Path) -> None:
    command = readme_command("1. The demo")
    assert "prefill-proxy demo" in command
    clone = fresh_copy(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    result = subprocess.run(
        ["bash", "-c", command],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "| cached share |" in result.stdout and "| TTFT p50 |" in result.stdout
