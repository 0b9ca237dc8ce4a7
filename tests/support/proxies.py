"""A proxy running for a test: its URL and its metrics, read in process."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry


@dataclasses.dataclass
class RunningProxy:
    url: str
    registry: CollectorRegistry

    def sample(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait (bounded) for work the proxy finishes after the client has its answer or
        is gone, such as recording a stream whose client disconnected."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError("condition not reached in time")
            time.sleep(0.01)
