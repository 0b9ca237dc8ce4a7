"""The command line both model builders share: build a model folder once, under a lock,
unless a complete build of the same script is already there.

A complete build carries MARKER holding its builder's ``build_id``; builders write it last,
into a temporary folder they then rename into place, so a folder with the marker is whole.
"""

from __future__ import annotations

import argparse
import fcntl
import sys
import time
from collections.abc import Callable
from pathlib import Path

MARKER = ".prefill-proxy-model"


def main(
    name: str,
    default: Path,
    build: Callable[[Path], None],
    build_id: Callable[[], str],
    description: str,
) -> int:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("out", nargs="?", type=Path, default=default)
    parser.add_argument("--force", action="store_true", help="rebuild even if complete")
    args = parser.parse_args()
    out: Path = args.out.expanduser().resolve()
    marker = out / MARKER
    out.parent.mkdir(parents=True, exist_ok=True)
    with (out.parent / f".{out.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test workers build once
        if not args.force and marker.is_file() and marker.read_text().strip() == build_id():
            print(f"[{name}] {out} is complete", file=sys.stderr, flush=True)
            return 0
        started = time.monotonic()
        build(out)
    print(f"[{name}] built {out} in {time.monotonic() - started:.0f}s", file=sys.stderr)
    return 0
