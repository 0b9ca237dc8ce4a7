"""prometheus_client's Counter, Gauge and Histogram, cheaper on the request path: children
kept by their label values, values changed without a lock, and a counter's increment and a
histogram's observation without the checks a series made by ``labels()`` or unlabelled
cannot fail. proxy.metrics defines the proxy's metrics with them."""

from __future__ import annotations

import bisect
from typing import Any, TypeVar

import prometheus_client
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.values import MutexValue

M = TypeVar("M", bound=type[MetricWrapperBase])


class _Value:
    """prometheus_client's MutexValue without the mutex: the proxy changes its metrics on
    its event loop's thread only (the scrape, in another thread or not, reads a float),
    and the lock was 0.3 us of each of the 20-odd changes a request makes."""

    __slots__ = ("_exemplar", "_value")

    def __init__(self) -> None:
        self._value = 0.0
        self._exemplar: Any = None

    def inc(self, amount: float) -> None:
        self._value += amount

    def set(self, value: float, timestamp: float | None = None) -> None:
        self._value = value

    def set_exemplar(self, exemplar: Any) -> None:
        self._exemplar = exemplar

    def get(self) -> float:
        return self._value

    def get_exemplar(self) -> Any:
        return self._exemplar


def _unlocked(value: Any) -> Any:
    """``value`` as a _Value, where it is the single-process kind (a multiprocess one,
    with PROMETHEUS_MULTIPROC_DIR set, stays as it is)."""
    return _Value() if type(value) is MutexValue else value


def _kept_children(base: M) -> M:
    """``base`` whose ``labels()`` keeps the children it hands out in a plain dict:
    prometheus_client's takes a lock and converts every value on each call (1.2-1.5 us),
    and a request makes about ten. Every label value here is bounded (see ``Metrics``).
    Its values are _Values."""

    class Kept(base):  # type: ignore[valid-type,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._kept: dict[tuple[Any, ...], Any] = {}

        def _metric_init(self) -> None:  # a series: unlabelled, or a child
            super()._metric_init()
            # Counters' and gauges' value; histograms' sum and buckets.
            state: dict[str, Any] = self.__dict__
            for name in ("_value", "_sum"):
                if name in state:
                    state[name] = _unlocked(state[name])
            if "_buckets" in state:
                state["_buckets"] = [_unlocked(bucket) for bucket in state["_buckets"]]

        def labels(self, *values: Any, **named: Any) -> Any:
            if named:
                return super().labels(*values, **named)
            child = self._kept.get(values)
            if child is None:
                child = self._kept[values] = super().labels(*values)
            return child

        def remove(self, *values: Any) -> None:
            self._kept.clear()
            super().remove(*values)

        def clear(self) -> None:
            self._kept.clear()
            super().clear()

    Kept.__name__ = Kept.__qualname__ = base.__name__
    return Kept  # type: ignore[return-value]


class _Series(MetricWrapperBase):
    """A metric that knows whether it is a series (unlabelled, or a child: what can
    change), so that a change need not ask prometheus_client again each time."""

    _series = False  # a parent with label names is not one

    def _metric_init(self) -> None:  # run for a series only
        super()._metric_init()  # type: ignore[misc]
        self._series = True

    def _raise_if_not_observable(self) -> None:
        if not self._series:
            super()._raise_if_not_observable()


class _Counter(_Series, prometheus_client.Counter):
    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        """prometheus_client's, in one step where it can only add (about 20 a request)."""
        if exemplar or amount < 0 or not self._series:
            super().inc(amount, exemplar)
        else:
            self._value.inc(amount)


class _Gauge(_Series, prometheus_client.Gauge):
    pass


class _Histogram(_Series, prometheus_client.Histogram):
    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        """prometheus_client's, its bucket found by bisection (its own walks the bounds
        from the first: a request's latency in seconds passes most of them)."""
        if exemplar or not self._series:
            super().observe(amount, exemplar)
            return
        self._sum.inc(amount)
        # The first bound the amount is at or under (none for NaN, as prometheus_client).
        index = bisect.bisect_left(self._upper_bounds, amount)
        if index < len(self._buckets) and amount <= self._upper_bounds[index]:
            self._buckets[index].inc(1)


Counter = _kept_children(_Counter)
Gauge = _kept_children(_Gauge)
Histogram = _kept_children(_Histogram)
