"""Every Prometheus metric the proxy exports, defined once on a registry passed in."""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry

from proxy.metric_classes import Counter, Gauge, Histogram

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
# A store call on the same network: well under a millisecond, up to the timeout.
STORE_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
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

# A young collection: a few ms at c=64; a full one walks every object the proxy holds.
GC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
TOKEN_BUCKETS = tuple(2.0**n for n in range(8, 19))  # 256 .. 262144 tokens
COUNT_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)

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
        # Read at scrape time from the Recorder, which owns the count.
        self.in_flight = Gauge(
            "prefill_proxy_in_flight_requests",
            "Requests being proxied now.",
            registry=registry,
        )
        self.client_disconnects = Counter(
            "prefill_proxy_client_disconnects",
            "Requests the client left before their end, while sending the body, waiting for "
            "the upstream or mid-stream (the upstream request is aborted).",
            ("route",),
            registry=registry,
        )
        self.internal_errors = Counter(
            "prefill_proxy_internal_errors",
            "Requests a bug in the proxy failed (answered 500 internal_error, logged with a "
            "traceback).",
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
        self.body_cache_bytes = Gauge(
            "prefill_proxy_body_cache_bytes",
            "Bytes of recent request bodies kept so that a conversation's next step is "
            "parsed only from where it is new (bounded by body_cache_bytes).",
            registry=registry,
        )
        self.gc_pauses = Histogram(
            "prefill_proxy_gc_pause_seconds",
            "Runs of the process's cyclic garbage collector, by generation (2: a full "
            "collection, which walks every object the proxy holds), each of which stops the "
            "event loop.",
            ("generation",),
            buckets=GC_BUCKETS,
            registry=registry,
        )
        self.body_parses = Counter(
            "prefill_proxy_body_parses",
            "Chat and Responses request bodies by how they were parsed: continued (from a kept "
            "earlier body of the conversation: only the new part) or whole.",
            ("outcome",),
            registry=registry,
        )
        self.early_uploads = Counter(
            "prefill_proxy_early_uploads",
            "Requests begun on the engine before the proxy had built them (early_upload_bytes), "
            "by outcome: used (the request built began with what was sent), or discarded (it "
            "differed, or the engine closed the connection: the request went again whole).",
            ("outcome",),
            registry=registry,
        )
        self.body_bytes_reused = Counter(
            "prefill_proxy_body_bytes_reused",
            "Bytes of chat request bodies not parsed again: the kept earlier body they "
            "continue.",
            registry=registry,
        )
        self.session_errors = Counter(
            "prefill_proxy_session_errors",
            "Session store failures (the request went on without its session: fail open).",
            registry=registry,
        )
        self.engines_healthy = Gauge(
            "prefill_proxy_engines_healthy",
            "Engines passing their health probe (all of them when there is only one).",
            registry=registry,
        )
        self.engine_requests = Counter(
            "prefill_proxy_engine_requests",
            "Requests sent to each engine (the proxy's own warm-ups and summaries included).",
            ("engine",),
            registry=registry,
        )
        self.routing = Counter(
            "prefill_proxy_routing_decisions",
            "Where requests went among several engines: new (a session placed by its "
            "hash), affinity (its engine), moved (to the next of its ranking; reason: "
            "unhealthy, overloaded, removed), no_session (least loaded).",
            ("decision", "reason"),
            registry=registry,
        )
        self.store_latency = Histogram(
            "prefill_proxy_session_store_seconds",
            "Session store calls that answered (get, save, delete, ping), by operation.",
            ("op",),
            buckets=STORE_BUCKETS,
            registry=registry,
        )
        self.store_errors = Counter(
            "prefill_proxy_session_store_errors",
            "Session store trouble by kind: timeout, connection, protocol, skipped (calls "
            "not made for a second after a failure), codec (a record not readable), "
            "too_large (a record trimmed to session_max_bytes).",
            ("kind",),
            registry=registry,
        )
        self.store_fallbacks = Counter(
            "prefill_proxy_session_store_fallbacks",
            "Records served from this replica's near copy because the store was down or "
            "answered it had none (restarted empty, evicted), by reason: down, lost.",
            ("reason",),
            registry=registry,
        )
        self.sessions_loaded = Counter(
            "prefill_proxy_sessions_loaded",
            "Requests that found their session's record in the store (found) or started one (new).",
            ("outcome",),
            registry=registry,
        )
        self.sessions_saved = Counter(
            "prefill_proxy_sessions_saved",
            "Session records saved to the store after a reply.",
            registry=registry,
        )
        self.replies_too_long = Counter(
            "prefill_proxy_replies_too_long",
            "Streamed replies longer than max_reply_chars: relayed whole, not recorded "
            "into their session (the next request's history is forwarded as sent).",
            registry=registry,
        )
        self.volatile_lines_learned = Counter(
            "prefill_proxy_volatile_lines_learned",
            "System-prompt lines learned volatile from a session's own requests (their "
            "text changed, their shape did not), moved to the tail from then on.",
            registry=registry,
        )
        self.session_conflicts = Counter(
            "prefill_proxy_session_conflicts",
            "Saves of a session record that another request of the same session saved "
            "first (its record was loaded again and the reply recorded into it).",
            registry=registry,
        )
        self.listener_failures = Counter(
            "prefill_proxy_listener_failures",
            "Follow-up work after a reply that failed (warm-up, compaction, round trips: "
            "the reply itself was not affected), by listener.",
            ("listener",),
            registry=registry,
        )

        # Compaction (proxy.compaction)
        self.compactions = Counter(
            "prefill_proxy_compactions",
            "Compaction events, by kind: elide (old tool results shortened), summary "
            "(old turns replaced by the running summary), fallback (oldest turns dropped).",
            ("kind",),
            registry=registry,
        )
        self.compaction_tokens_removed = Counter(
            "prefill_proxy_compaction_removed_tokens",
            "Prompt tokens (estimated) taken out of forwarded prompts by compaction events.",
            registry=registry,
        )
        self.compacted_prompt_tokens = Histogram(
            "prefill_proxy_compacted_prompt_tokens",
            "Estimated prompt tokens of a request right after a compaction event.",
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self.summary_latency = Histogram(
            "prefill_proxy_summary_seconds",
            "Time to write a summary (background request to the summarizer).",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.summaries = Counter(
            "prefill_proxy_summaries",
            "Summaries by outcome when a compaction needed one: on_time (ready), late "
            "(ready within summary_wait), missing (not ready: fallback), failed.",
            ("outcome",),
            registry=registry,
        )
        self.compaction_wait = Histogram(
            "prefill_proxy_compaction_wait_seconds",
            "Time a request past the high watermark waited for its summary.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.compaction_fallbacks = Counter(
            "prefill_proxy_compaction_fallbacks",
            "Compactions that dropped the oldest turns instead of summarizing, by reason: "
            "summary_failed, summary_late, still_over (a summary was not enough); and "
            "requests forwarded unchanged because even the head plus the newest turn is too "
            "long (too_long).",
            ("reason",),
            registry=registry,
        )
        self.context_overflows = Counter(
            "prefill_proxy_context_overflows",
            "Requests the engine refused for exceeding its context (vLLM says "
            "'max_tokens must be at least 1, got -N').",
            registry=registry,
        )
        # Speculative prefill (proxy.warmup)
        self.warmups = Counter(
            "prefill_proxy_warmups",
            "Warm-up requests by trigger (tool_calls: right after a reply with tool calls; "
            "tool_calls_timed: just before the client is expected back; compaction: a newly "
            "compacted prompt) and outcome (ok, error).",
            ("trigger", "outcome"),
            registry=registry,
        )
        self.warmups_skipped = Counter(
            "prefill_proxy_warmups_skipped",
            "Warm-ups not sent, by reason (session_busy, global_cap, engine_busy, "
            "proxy_busy, too_short, disabled, client_back: the client returned first, "
            "still_cached: the engine's recent timed warm-ups found their prefix cached, "
            "evicted_before_use: half of them were evicted again before their step, "
            "engine_saturated: the engine queued requests in 3/10 of the last 30 s, "
            "short_round: the session's last tool round was under a second, "
            "irregular_rounds: its last rounds varied too widely to time a warm-up).",
            ("reason",),
            registry=registry,
        )
        self.warmup_duration = Histogram(
            "prefill_proxy_warmup_seconds",
            "Duration of a warm-up request.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.warmup_tokens = Counter(
            "prefill_proxy_warmup_computed_tokens",
            "Prompt tokens the engine computed for warm-ups (prompt minus cached): the "
            "extra work they cost.",
            registry=registry,
        )
        self.step_ttft = Histogram(
            "prefill_proxy_step_time_to_first_token_seconds",
            "TTFT of a step that follows a reply with tool calls, by whether the proxy "
            "warmed its prefix (warmed: yes, no).",
            ("warmed",),
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.warmed_steps = Counter(
            "prefill_proxy_warmed_steps",
            "Steps after tool calls whose prefix a warm-up had computed, by whether the "
            "engine still had it (outcome: cached; missed: evicted since, or the prompt "
            "diverged).",
            ("outcome",),
            registry=registry,
        )
        self.engine_queued_share = Gauge(
            "prefill_proxy_engine_queued_share",
            "Share of the engine's /metrics readings of the last 30 s in which it queued "
            "more than warmup_max_waiting requests, as last read for a warm-up (warm-ups "
            "stop from 0.5: no idle time to use).",
            ("engine",),
            registry=registry,
        )
        # Round trips (proxy.batching) and fan-out (proxy.fanout)
        self.tool_calls_per_step = Histogram(
            "prefill_proxy_tool_calls_per_step",
            "Tool calls in an assistant reply that made any.",
            buckets=COUNT_BUCKETS,
            registry=registry,
        )
        self.steps_per_user_turn = Histogram(
            "prefill_proxy_steps_per_user_turn",
            "Model calls between a user message and the reply that ends the turn without "
            "tool calls.",
            buckets=COUNT_BUCKETS,
            registry=registry,
        )
        self.fanout_holds = Counter(
            "prefill_proxy_fanout_holds",
            "Requests held for a concurrent one with the same uncached prefix, by how the "
            "hold ended: released (the leader's first token came, or the leader failed and "
            "this one took over), timeout.",
            ("outcome",),
            registry=registry,
        )
        self.fanout_hold_time = Histogram(
            "prefill_proxy_fanout_hold_seconds",
            "Time a request was held behind a concurrent one with the same prefix.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
