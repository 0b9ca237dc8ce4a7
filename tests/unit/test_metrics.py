"""The metric classes whose children are kept: what they export is what prometheus_client's
own would, through removals and clears too."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from proxy.metric_classes import Counter, Gauge, Histogram


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_kept_children_count_as_prometheus_client_s_own() -> None:
    registry = CollectorRegistry()
    counter = Counter("calls", "Calls.", ["route", "status"], registry=registry)
    counter.labels("chat", "200").inc()
    counter.labels("chat", "200").inc(2)
    counter.labels(route="chat", status="500").inc()  # by name: prometheus_client's path
    assert value(registry, "calls_total", route="chat", status="200") == 3
    assert value(registry, "calls_total", route="chat", status="500") == 1
    assert counter.labels("chat", "200") is counter.labels("chat", "200")


@pytest.mark.parametrize("drop", ["remove", "clear"])
def test_a_removed_child_is_not_kept(drop: str) -> None:
    registry = CollectorRegistry()
    gauge = Gauge("engines_up", "Up.", ["engine"], registry=registry)
    gauge.labels("a").set(1)
    gauge.remove("a") if drop == "remove" else gauge.clear()
    assert value(registry, "engines_up", engine="a") is None
    gauge.labels("a").set(5)  # a new child, exported again
    assert value(registry, "engines_up", engine="a") == 5


def test_histogram_children_are_kept_too() -> None:
    registry = CollectorRegistry()
    histogram = Histogram("wait_seconds", "Wait.", ["route"], registry=registry, buckets=(1,))
    histogram.labels("chat").observe(0.5)
    histogram.labels("chat").observe(2)
    assert value(registry, "wait_seconds_count", route="chat") == 2
    assert value(registry, "wait_seconds_bucket", route="chat", le="1.0") == 1
