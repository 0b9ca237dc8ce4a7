"""Compaction: a running summary behind a verbatim window of recent turns."""

from proxy.compaction.compactor import Compactor

__all__ = ["Compactor"]
