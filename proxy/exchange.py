"""One proxied request's record, and turning it into metrics and one log line when it ends."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from proxy import jsonio
from proxy.metrics import Metrics

access_log = logging.getLogger("prefill_proxy.access")
log = logging.getLogger("prefill_proxy.exchange")


@dataclasses.dataclass
class Exchange:
    """What happened to one request; filled in along the way, recorded once at the end."""

    route: str
    method: str
    started: float = dataclasses.field(default_factory=time.perf_counter)
    model: str = ""
    stream: bool = False
    status: int = 0
    overhead_s: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    token_gaps: list[float] = dataclasses.field(default_factory=list)
    usage: dict[str, Any] | None = None
    rewrites: tuple[str, ...] = ()
    rewrite_failures: tuple[str, ...] = ()
    error_kind: str = ""
    client_disconnected: bool = False
    prefix_break: str = ""  # proxy.prefix.REASONS; empty without a session
    expected_cached: int | None = None
    reply: dict[str, Any] | None = None  # the assistant message as emitted, when kept
    compaction: str = ""  # the compaction event this request carried, if any
    learned_lines: int = 0  # system lines moved because the session learned them volatile
    held_s: float = 0.0  # time held behind a concurrent request (proxy.fanout)
    context_overflow: bool = False  # the engine refused the prompt as too long
    # Called once, at the first token or (without one) when the exchange ends.
    on_first_token: list[Callable[[], None]] = dataclasses.field(default_factory=list)
    # Where inter-token gaps go as they happen (Recorder.gap_observer), so a long stream
    # keeps none of them; without one they are kept in token_gaps until the end.
    observe_gap: Callable[[float], None] | None = None

    def mark_token(self, now: float) -> None:
        if self.first_token_at is None:
            self.first_token_at = now
            self.first_token_reached()
        elif self.last_token_at is not None:
            if self.observe_gap is not None:
                self.observe_gap(now - self.last_token_at)
            else:
                self.token_gaps.append(now - self.last_token_at)
        self.last_token_at = now

    def first_token_reached(self) -> None:
        callbacks, self.on_first_token = self.on_first_token, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a follower's bookkeeping must not break the relay
                log.exception("first-token callback failed")

    @property
    def overhead_ms_header(self) -> bytes:
        return f"{(self.overhead_s or 0.0) * 1000:.3f}".encode()


def _int(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


def token_counts(usage: dict[str, Any] | None) -> tuple[int, int, int] | None:
    """(prompt, cached, completion) from an OpenAI usage object, or None without one."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return _int(usage.get("prompt_tokens")), cached, _int(usage.get("completion_tokens"))


@dataclasses.dataclass(frozen=True)
class _RouteSeries:
    """The series of one route and model label, looked up once: prometheus-client's
    ``labels()`` costs a few microseconds a call, and a request records a dozen."""

    duration: Any
    ttft: Any
    decode: Any
    itl: Any
    prompt: Any
    cached: Any
    computed: Any
    completion: Any
    expected: Any

    @classmethod
    def of(cls, m: Metrics, route: str, model: str) -> _RouteSeries:
        return cls(
            *(
                metric.labels(route, model)
                for metric in (
                    m.request_duration,
                    m.time_to_first_token,
                    m.decode,
                    m.inter_token_latency,
                    m.prompt_tokens,
                    m.cached_prompt_tokens,
                    m.computed_prompt_tokens,
                    m.completion_tokens,
                    m.expected_cached_tokens,
                )
            )
        )


class Recorder:
    """Owns the exchanges in flight; records each finished one: metrics, then the access
    log line."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.in_flight = 0
        metrics.in_flight.set_function(lambda: self.in_flight)
        # Bounded: routes are the proxy's, model labels are capped (model_label_limit).
        self._series: dict[tuple[str, str], _RouteSeries] = {}

    def _route_series(self, route: str, model: str) -> _RouteSeries:
        series = self._series.get((route, model))
        if series is None:
            series = self._series[(route, model)] = _RouteSeries.of(self.metrics, route, model)
        return series

    def begin(self, route: str, method: str) -> Exchange:
        self.in_flight += 1
        return Exchange(route, method)

    def gap_observer(self, exchange: Exchange) -> Callable[[float], None]:
        """Where ``exchange``'s inter-token gaps go once its route and model are known."""
        model = self.metrics.model_label(exchange.model or "unknown")
        return self._route_series(exchange.route, model).itl.observe

    def finish(self, exchange: Exchange) -> None:
        ended = time.perf_counter()
        self.in_flight -= 1
        exchange.first_token_reached()  # releases anything still waiting on this request
        m = self.metrics
        model = m.model_label(exchange.model or "unknown")
        route = exchange.route
        series = self._route_series(route, model)
        m.requests.labels(route, model, str(exchange.status)).inc()
        series.duration.observe(ended - exchange.started)
        if exchange.overhead_s is not None:
            m.overhead.labels(route).observe(exchange.overhead_s)
        if exchange.error_kind:
            m.upstream_errors.labels(exchange.error_kind).inc()
        if exchange.client_disconnected:
            m.client_disconnects.labels(route).inc()
        if exchange.context_overflow:
            m.context_overflows.inc()
        if exchange.prefix_break:
            m.prefix_breaks.labels(exchange.prefix_break).inc()
        for name in exchange.rewrites:
            m.rewrites_applied.labels(name).inc()
        for name in exchange.rewrite_failures:
            m.rewrite_failures.labels(name).inc()
        ttft = decode = None
        if exchange.first_token_at is not None:
            ttft = exchange.first_token_at - exchange.started
            decode = (exchange.last_token_at or exchange.first_token_at) - exchange.first_token_at
            series.ttft.observe(ttft)
            series.decode.observe(decode)
            for gap in exchange.token_gaps:
                series.itl.observe(gap)
        counts = token_counts(exchange.usage)
        if counts is not None:
            prompt, cached, completion = counts
            series.prompt.inc(prompt)
            series.cached.inc(cached)
            series.computed.inc(max(prompt - cached, 0))
            series.completion.inc(completion)
            if exchange.expected_cached is not None:
                # The engine always computes a prompt's last token (vLLM v1).
                expected = min(exchange.expected_cached, max(prompt - 1, 0))
                series.expected.inc(expected)
        if access_log.isEnabledFor(logging.INFO):
            access_log.info(_log_line(exchange, ended, ttft, decode, counts))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _log_line(
    exchange: Exchange,
    ended: float,
    ttft: float | None,
    decode: float | None,
    counts: tuple[int, int, int] | None,
) -> str:
    prompt, cached, completion = counts if counts is not None else (None, None, None)
    record = {
        "route": exchange.route,
        "method": exchange.method,
        "model": exchange.model or None,
        "status": exchange.status,
        "stream": exchange.stream,
        "duration_ms": _ms(ended - exchange.started),
        "overhead_ms": _ms(exchange.overhead_s),
        "ttft_ms": _ms(ttft),
        "decode_ms": _ms(decode),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "completion_tokens": completion,
        "rewrites": list(exchange.rewrites),
    }
    if exchange.prefix_break:
        record["prefix"] = exchange.prefix_break
        record["expected_cached_tokens"] = exchange.expected_cached
    if exchange.compaction:
        record["compaction"] = exchange.compaction
    if exchange.learned_lines:
        record["learned_lines"] = exchange.learned_lines
    if exchange.context_overflow:
        record["context_overflow"] = True
    if exchange.rewrite_failures:
        record["rewrite_failures"] = list(exchange.rewrite_failures)
    if exchange.error_kind:
        record["upstream_error"] = exchange.error_kind
    if exchange.client_disconnected:
        record["client_disconnected"] = True
    return jsonio.dumps(record).decode()
