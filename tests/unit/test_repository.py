"""The repository stands on its own: no file refers to a path beside the clone (a user's
clone has nothing there), and the bundled traces are where the tools look for them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The folder of a development checkout's neighbours, written as a relative path or by its
# files' names; assembled here so this file does not match itself.
OUTSIDE = re.compile("|".join([r"\.\./" + "shared", "shared/" + "(traces|FACTS|DESIGN|STYLE)"]))


def test_no_file_refers_outside_the_repository() -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    offenders = []
    for name in filter(None, tracked.split("\0")):
        path = ROOT / name
        if not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        offenders += [
            f"{name}:{n}" for n, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)
        ]
    assert offenders == []
