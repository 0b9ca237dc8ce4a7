"""Speculative prefill (stub: wired, not yet warming)."""

from __future__ import annotations

from proxy.exchange import Exchange
from proxy.tracker import Turn


class Warmer:
    def after_reply(self, turn: Turn, exchange: Exchange) -> None:
        return None
