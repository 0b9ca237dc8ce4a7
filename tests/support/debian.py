"""Debian tools the deploy tests run for real (tests/deploy/install_tools.sh installs them)."""

from __future__ import annotations

import shutil

import pytest


def require(tools: dict[str, str]) -> None:
    """Fail (never skip) naming the Debian packages to install when a tool is missing."""
    missing = sorted({package for tool, package in tools.items() if shutil.which(tool) is None})
    if missing:
        pytest.fail(
            f"missing {', '.join(missing)}: run `apt-get install {' '.join(missing)}` "
            "(tests/run.sh does it when run as root)",
            pytrace=False,
        )
