"""Fixtures every test folder shares."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """anyio's pytest plugin runs ``@pytest.mark.anyio`` tests on asyncio (the proxy's loop)."""
    return "asyncio"
