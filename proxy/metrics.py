"""Every Prometheus metric the proxy exports, defined once on a registry passed in."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# LLM latencies span milliseconds (a cached prefill on a GPU) to minutes (a cold 100k-token
# prompt, a long generation), so the buckets do too.
LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    320.0,
    640.0,
)
INTER_TOKEN_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.15,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
OVERHEAD_BUCKETS = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.5,
)

OTHER = "other"


class LabelLimiter:
    """Keeps a client-chosen label (the model name) bounded: the first ``limit`` distinct
    values are used as they are, every later one becomes ``other``."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) < self._limit:
                self._seen.add(value)
                return value
        return OTHER


class Metrics:
    """The proxy's metrics. Labels are bounded: route, model, status, kind, transform."""

    def __init__(self, registry: CollectorRegistry, *, model_label_limit: int = 32) -> None:
        self.registry = registry
        self.model_label = LabelLimiter(model_label_limit)
        by_route_model = ("route", "model")

        self.time_to_first_token = Histogram(
            "prefill_proxy_time_to_first_token_seconds",
            "Request arrival to the first generated token relayed (streams only).",
            by_route_model,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.decode = Histogram(
            "prefill_proxy_decode_seconds",
            "First generated token to the last one (streams only).",
            by_route_model,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.inter_token_latency = Histogram(
            "prefill_proxy_inter_token_latency_seconds",
            "Time between two consecutive token chunks of a stream.",
            by_route_model,
            buckets=INTER_TOKEN_BUCKETS,
            registry=registry,
        )
        self.request_duration = Histogram(
            "prefill_proxy_request_duration_seconds",
            "Request arrival to the last byte relayed.",
            by_route_model,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.overhead = Histogram(
            "prefill_proxy_overhead_seconds",
            "Time inside the proxy before the request goes upstream.",
            ("route",),
            buckets=OVERHEAD_BUCKETS,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "prefill_proxy_prompt_tokens",
            "Prompt tokens reported by the engine.",
            by_route_model,
            registry=registry,
        )
        self.cached_prompt_tokens = Counter(
            "prefill_proxy_cached_prompt_tokens",
            "Prompt tokens served from the engine's prefix cache "
            "(usage.prompt_tokens_details.cached_tokens).",
            by_route_model,
            registry=registry,
        )
        self.computed_prompt_tokens = Counter(
            "prefill_proxy_computed_prompt_tokens",
            "Prompt tokens the engine had to prefill (prompt minus cached).",
            by_route_model,
            registry=registry,
        )
        self.completion_tokens = Counter(
            "prefill_proxy_completion_tokens",
            "Generated tokens reported by the engine.",
            by_route_model,
            registry=registry,
        )
        self.requests = Counter(
            "prefill_proxy_requests",
            "Requests answered, by final status code.",
            ("route", "model", "status"),
            registry=registry,
        )
        self.upstream_errors = Counter(
            "prefill_proxy_upstream_errors",
            "Upstream failures: connect, timeout, read (broken mid-exchange), "
            "status_4xx, status_5xx, stream_error (an error event inside a stream).",
            ("kind",),
            registry=registry,
        )
        self.rewrite_failures = Counter(
            "prefill_proxy_rewrite_failures",
            "Transforms that raised; the request went upstream without them (fail open).",
            ("transform",),
            registry=registry,
        )
        self.rewrites_applied = Counter(
            "prefill_proxy_rewrites_applied",
            "Transforms that changed a request.",
            ("transform",),
            registry=registry,
        )
        self.in_flight = Gauge(
            "prefill_proxy_in_flight_requests",
            "Requests being proxied now.",
            registry=registry,
        )
        self.client_disconnects = Counter(
            "prefill_proxy_client_disconnects",
            "Streams the client closed before the end (the upstream request is aborted).",
            ("route",),
            registry=registry,
        )
        self.prefix_breaks = Counter(
            "prefill_proxy_prefix_breaks",
            "Requests by how their prompt continues the session's previous one (plus its "
            "reply): none, new_session, system_changed, tools_changed, history_rewritten.",
            ("reason",),
            registry=registry,
        )
        self.expected_cached_tokens = Counter(
            "prefill_proxy_expected_cached_prompt_tokens",
            "Prompt tokens the engine should have had cached, from the session's previous "
            "step; well above cached_prompt_tokens means the engine evicted the blocks.",
            by_route_model,
            registry=registry,
        )
        self.sessions_active = Gauge(
            "prefill_proxy_sessions_active",
            "Sessions held by the session store.",
            registry=registry,
        )
        self.session_errors = Counter(
            "prefill_proxy_session_errors",
            "Session store failures (the request went on without its session: fail open).",
            registry=registry,
        )
