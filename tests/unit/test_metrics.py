"""The metric classes whose children are kept: what they export is what prometheus_client's
own would, through removals and clears too."""

from __future__ import annotations

import prometheus_client
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


def samples(registry: CollectorRegistry) -> list[tuple[str, tuple[tuple[str, str], ...], str]]:
    """What a scrape gets, less the creation times (which differ); values as text, so
    that a NaN sum equals another."""
    return sorted(
        (sample.name, tuple(sorted(sample.labels.items())), repr(sample.value))
        for metric in registry.collect()
        for sample in metric.samples
        if not sample.name.endswith("_created")
    )


AMOUNTS = [0.0, 0.05, 0.1, 0.1000001, 0.5, 1.0, 2.5, 7.0, 1e9, -3.0, float("nan"), 0.25]


@pytest.mark.parametrize("labelled", [True, False])
def test_a_histogram_exports_what_prometheus_client_s_would(labelled: bool) -> None:
    """Bisection finds the bucket prometheus_client's walk does: on a bound, between,
    past the last, below the first, and none for NaN."""
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    names = ["route"] if labelled else []
    buckets = (0.1, 0.25, 1.0, 5.0)
    mine = Histogram("wait_seconds", "Wait.", names, registry=ours, buckets=buckets)
    reference = prometheus_client.Histogram(
        "wait_seconds", "Wait.", names, registry=theirs, buckets=buckets
    )
    for amount in AMOUNTS:
        for histogram in (mine, reference):
            (histogram.labels("chat") if labelled else histogram).observe(amount)
    assert samples(ours) == samples(theirs)


def test_a_counter_exports_what_prometheus_client_s_would() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine = Counter("calls", "Calls.", ["route"], registry=ours)
    reference = prometheus_client.Counter("calls", "Calls.", ["route"], registry=theirs)
    for counter in (mine, reference):
        counter.labels("chat").inc()
        counter.labels("chat").inc(2.5)
        counter.labels("chat").inc(0)
        counter.labels("chat").inc(1, exemplar={"trace": "a"})
        with pytest.raises(ValueError):  # counters only go up
            counter.labels("chat").inc(-1)
    assert samples(ours) == samples(theirs)


def test_a_parent_still_cannot_change() -> None:
    """A metric with label names is no series: changing it without labels() fails, as
    with prometheus_client's own classes."""
    registry = CollectorRegistry()
    counter = Counter("calls", "Calls.", ["route"], registry=registry)
    histogram = Histogram("wait_seconds", "Wait.", ["route"], registry=registry)
    gauge = Gauge("engines_up", "Up.", ["engine"], registry=registry)
    with pytest.raises(ValueError, match="missing label values"):
        counter.inc()
    with pytest.raises(ValueError, match="missing label values"):
        histogram.observe(1)
    with pytest.raises(ValueError, match="missing label values"):
        gauge.set(1)
    assert samples(registry) == []
