"""Compaction of long sessions (stub: wired, not yet compacting)."""

from __future__ import annotations

from typing import Any

from proxy.exchange import Exchange
from proxy.tracker import Turn


class Compactor:
    async def apply(
        self, request: dict[str, Any], turn: Turn, exchange: Exchange
    ) -> dict[str, Any]:
        """The request to forward: ``request`` itself, or a compacted copy."""
        return request

    def after_reply(self, turn: Turn, exchange: Exchange) -> None:
        return None
