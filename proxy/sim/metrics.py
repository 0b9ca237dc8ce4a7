"""The simulator's Prometheus metrics, under vLLM's names, labels and buckets.

Names, help texts and bucket boundaries follow vLLM 0.32 (``vllm/v1/metrics/loggers.py``,
``buckets.py``); every series carries ``model_name`` and ``engine`` (always "0": one
engine). Times are what a client observes (wall time, so divided by ``--speed``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

if TYPE_CHECKING:
    from proxy.sim.engine import Handle

TTFT_BUCKETS = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0),
    *(2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
)
ITL_BUCKETS = (
    *(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5),
    *(5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
)
REQUEST_LATENCY_BUCKETS = (
    *(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0),
    *(40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)
LABELS = ("model_name", "engine")
ENGINE = "0"


def token_buckets(max_value: int) -> list[float]:
    """vLLM's 1-2-5 series up to ``max_value`` (1, 2, 5, 10, 20, 50, ...)."""
    buckets: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


class SimMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        model_name: str,
        *,
        max_model_len: int,
        block_size: int,
        num_blocks: int,
    ) -> None:
        labels = {"model_name": model_name, "engine": ENGINE}

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, LABELS, registry=registry).labels(**labels)

        def histogram(name: str, doc: str, buckets: object) -> Histogram:
            metric = Histogram(name, doc, LABELS, buckets=buckets, registry=registry)  # type: ignore[arg-type]
            return metric.labels(**labels)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, LABELS, registry=registry).labels(**labels)

        self._running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self._waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self._kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_tokens_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."
        )
        by_source = Counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            (*LABELS, "source"),
            registry=registry,
        )
        self.prompt_computed = by_source.labels(**labels, source="local_compute")
        self.prompt_cache_hit = by_source.labels(**labels, source="local_cache_hit")
        by_source.labels(**labels, source="external_kv_transfer")
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        # The simulator's own (vLLM has no such series): how long the engine ran steps, in
        # wall seconds, so a benchmark can tell an idle engine from a saturated one.
        self.busy_seconds = counter(
            "sim:engine_busy_seconds", "Wall seconds the engine spent running steps."
        )
        self.compute_seconds = counter(
            "sim:engine_compute_seconds",
            "Wall seconds of those steps' arithmetic (the rest of a step bound by memory "
            "traffic is room for more tokens at no cost).",
        )
        self._success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            (*LABELS, "finished_reason"),
            registry=registry,
        )
        self._labels = labels
        tokens = token_buckets(max_model_len)
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tokens
        )
        self.prefill_kv_computed = histogram(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            tokens,
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ("block_size", "enable_prefix_caching", "engine", "num_gpu_blocks"),
            registry=registry,
        )
        info.labels(str(block_size), "True", ENGINE, str(num_blocks)).set(1)

    def observe_engine(
        self,
        *,
        running: Callable[[], float],
        waiting: Callable[[], float],
        kv_usage: Callable[[], float],
    ) -> None:
        """The gauges are read from the engine at scrape time."""
        self._running.set_function(running)
        self._waiting.set_function(waiting)
        self._kv_usage.set_function(kv_usage)

    def admitted(self, handle: Handle) -> None:
        self.prefix_queries.inc(handle.prompt_tokens)
        self.prefix_hits.inc(handle.cached_tokens)
        if handle.scheduled_at is not None:
            self.queue_time.observe(handle.scheduled_at - handle.arrival)

    def first_token(self, handle: Handle) -> None:
        computed = handle.prompt_tokens - handle.cached_tokens
        self.prompt_tokens.inc(handle.prompt_tokens)
        self.prompt_tokens_cached.inc(handle.cached_tokens)
        self.prompt_computed.inc(computed)
        self.prompt_cache_hit.inc(handle.cached_tokens)
        self.request_prompt_tokens.observe(handle.prompt_tokens)
        self.prefill_kv_computed.observe(computed)
        assert handle.first_token_at is not None
        self.ttft.observe(handle.first_token_at - handle.arrival)
        if handle.scheduled_at is not None:
            self.prefill_time.observe(handle.first_token_at - handle.scheduled_at)

    def inter_token(self, seconds: float) -> None:
        self.itl.observe(seconds)

    def generated(self, count: int) -> None:
        self.generation_tokens.inc(count)

    def preempted(self, count: int) -> None:
        if count:
            self.preemptions.inc(count)

    def finished(self, handle: Handle) -> None:
        assert handle.finished_at is not None and handle.first_token_at is not None
        self._success.labels(**self._labels, finished_reason=handle.finish_reason).inc()
        self.request_generation_tokens.observe(handle.completion_tokens)
        self.e2e.observe(handle.finished_at - handle.arrival)
        self.decode_time.observe(handle.finished_at - handle.first_token_at)
        if handle.scheduled_at is not None:
            self.inference_time.observe(handle.finished_at - handle.scheduled_at)
