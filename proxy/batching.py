"""Round-trip metrics (stub)."""

from __future__ import annotations

from proxy.exchange import Exchange
from proxy.tracker import Turn


class RoundTrips:
    def after_reply(self, turn: Turn, exchange: Exchange) -> None:
        return None
