"""Fan-out holds (stub: wired, never holding)."""

from __future__ import annotations

from typing import Any

from proxy.exchange import Exchange


class FanoutGate:
    async def admit(self, request: dict[str, Any], exchange: Exchange) -> None:
        """Return when ``request`` may go upstream."""
        return None
