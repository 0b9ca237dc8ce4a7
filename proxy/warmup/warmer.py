"""The warm-up machinery: a ReplyListener that sends warm-ups as background tasks, within
the bounds of proxy.warmup.policy, and observes the TTFT of the steps after tool calls.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from proxy import jsonio
from proxy.config import Settings
from proxy.engine import EngineMonitor
from proxy.errors import UpstreamError
from proxy.exchange import Exchange, token_counts
from proxy.metrics import Metrics
from proxy.sessions import Session
from proxy.turn import Turn
from proxy.upstream import RawHeaders, Upstream
from proxy.warmup.ledger import TimedLedger
from proxy.warmup.policy import (
    GAPS_KEPT,
    RETRY_S,
    Limits,
    engine_busy,
    irregular,
    saturated,
    short_rounds,
    skip_reason,
    warm_delay,
)
from proxy.warmup.shape import (
    DEFAULT_BLOCK_SIZE,
    chat_body,
    completion_body,
    route_missing,
    tokenize_body,
    warm_length,
)

log = logging.getLogger("prefill_proxy.warmup")

TIMEOUT_S = 120.0  # a warm-up still running after this is no help to anyone
STATUS_MAX_AGE_S = 2.0  # engine readings older than this are refreshed before a warm-up
RECOMPUTE_BLOCKS = 4  # warm-ups that computed this many blocks count as recomputing
RECOMPUTE_WEIGHT = 0.2  # of the newest one in the moving average of their durations


class WarmupFailed(Exception):
    pass


class _RouteMissing(Exception):
    """The engine has no such route (not vLLM's token API)."""


def _checked(status: int, body: bytes) -> bytes:
    if route_missing(status, body):
        raise _RouteMissing
    if status != 200:
        raise WarmupFailed(f"the engine answered {status}: {body[:200]!r}")
    return body


@dataclasses.dataclass
class _Job:
    request: dict[str, Any]
    messages: list[Any]
    credentials: RawHeaders
    session_key: str
    trigger: str
    engine: str = ""  # the session's engine ("": the first upstream)
    marks: bool = False  # a warm-up for the step after tool calls: its session is told
    client_back: bool = False  # the session's next request came: this job is late
    delay: float | None = None  # then warm again this many seconds later (timed)
    window: float = 0.0  # and until this many seconds after that (the client's return)
    tokens: list[int] | None = None  # the rendered prompt, once /tokenize said
    too_short: bool = False
    short_rounds: bool = False  # the session's tool rounds are too short to warm in
    irregular: bool = False  # or vary too widely to time a second warm-up
    warmed: int = 0  # prompt tokens the last warm-up sent left cached


def _set_warmed(tokens: int, session: Session) -> None:
    session.warmed, session.warmed_tokens = True, tokens


class Warmer:
    """Warms the engine after replies with tool calls (a ReplyListener) and on request
    (``warm``, for compaction). Also observes the TTFT of the steps that follow tool calls,
    warmed or not, also with the ``warmup`` setting off (then every warm-up is skipped as
    ``disabled``), so the two can be compared."""

    def __init__(
        self,
        settings: Settings,
        upstream: Upstream,
        metrics: Metrics,
        *,
        in_flight: Callable[[], float],
        post: Callable[[str, Callable[[Session], None]], None] | None = None,
        monitor: EngineMonitor | None = None,
        clock: Callable[[], float] = time.perf_counter,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self._enabled = settings.warmup  # off: only the step TTFTs are observed
        self._limits = Limits.from_settings(settings)
        self._block_size = settings.engine_block_size or None
        self._priority = settings.warmup_priority
        self._upstream = upstream
        self._metrics = metrics
        self._in_flight = in_flight  # the proxy's requests in flight (Recorder.in_flight)
        self._post = post  # results for a session's record (SessionTracker.post)
        # Each engine's queue, read while warm-ups for it are wanted ("": the first one).
        self._monitors = {"": monitor or EngineMonitor(upstream.call)}
        self._clock = clock  # the exchanges' clock (Exchange.started)
        # Wall time for what goes into the record: another replica reads it.
        self._wall = wall
        self._sleep = sleep
        # Per session: its warm-up task and job (runtime only: the record is the session's).
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._jobs: dict[str, _Job] = {}
        self._sending: set[str] = set()  # sessions whose warm-up request is out now
        self._token_route = True  # /tokenize and /v1/completions served (until a 404)
        # How long recent warm-ups took that recomputed evicted blocks (moving average):
        # the engine's speed, which the timed warm-up's lead must leave room for.
        self._recompute_s = 0.0
        # What each engine's recent timed warm-ups showed (whether they pay there).
        self._ledger = TimedLedger()

    @property
    def block_size(self) -> int:
        known = (m.block_size for m in self._monitors.values() if m.block_size)
        return self._block_size or next(known, None) or DEFAULT_BLOCK_SIZE

    def after_reply(self, turn: Turn, exchange: Exchange) -> None:
        if turn.follows_tool_calls and exchange.first_token_at is not None:
            ttft = exchange.first_token_at - exchange.started
            self._metrics.step_ttft.labels("yes" if turn.warmed else "no").observe(ttft)
        self._judge_warmup(turn, exchange)
        pace = turn.session.pace  # saved with the record after this call
        wall = self._wall()
        began = wall - (self._clock() - exchange.started)  # this request's start, wall time
        if turn.follows_tool_calls and pace.replied_at is not None:
            pace.add_gap(max(began - pace.replied_at, 0.0), GAPS_KEPT)
        reply = exchange.reply
        if not (reply and reply.get("tool_calls")):
            pace.replied_at = None
            return
        pace.replied_at = wall
        if not turn.full_history:
            return  # the engine holds the history (previous_response_id): no prompt to warm
        delay = warm_delay(pace.gaps, self._recompute_s)
        job = _Job(
            turn.request,
            [*turn.forwarded_messages, reply],
            turn.credentials,
            turn.session.key,
            "tool_calls",
            turn.session.engine,
            marks=True,
            delay=delay,
            window=min(pace.gaps) - delay if delay is not None else 0.0,
            short_rounds=short_rounds(pace.gaps),
            irregular=irregular(pace.gaps),
        )
        self._start(job)

    def _judge_warmup(self, turn: Turn, exchange: Exchange) -> None:
        """Whether the engine still held what this step's warm-up computed: a warm-up
        evicted before its step came is pure cost."""
        counts = token_counts(exchange.usage)
        if turn.follows_tool_calls and turn.warmed_tokens and counts is not None:
            held = counts[1] >= turn.warmed_tokens
            self._metrics.warmed_steps.labels("cached" if held else "missed").inc()
        cached = counts[1] if counts is not None and turn.follows_tool_calls else None
        self._ledger.step(turn.session.key, cached)

    def client_back(self, session_key: str) -> None:
        """The session's next request arrived (SessionTracker.on_open): its warm-up is late."""
        job = self._jobs.get(session_key)
        if job is not None:
            job.client_back = True

    def warm(
        self,
        request: dict[str, Any],
        credentials: RawHeaders,
        session_key: str,
        trigger: str = "compaction",
        engine: str = "",
    ) -> None:
        """Warm ``request``'s messages (a forwarded chat request) in the background, within
        the same bounds. Returns at once."""
        messages = request.get("messages")
        if isinstance(messages, list) and messages:
            job = _Job(request, list(messages), credentials, session_key, trigger, engine)
            self._start(job)

    def _start(self, job: _Job) -> None:
        if not self._enabled:
            self._metrics.warmups_skipped.labels("disabled").inc()
            return
        key = job.session_key
        if key in self._sending:
            self._metrics.warmups_skipped.labels("session_busy").inc()
            return
        previous = self._tasks.pop(key, None)
        if previous is not None:
            previous.cancel()  # waiting to warm a prefix this newer one extends
            self._jobs.pop(key, None)
        if job.short_rounds:  # before the engine is read: nothing to read it for
            self._metrics.warmups_skipped.labels("short_round").inc()
            return
        if job.delay is not None and job.irregular:  # the one right after the reply goes
            self._metrics.warmups_skipped.labels("irregular_rounds").inc()
            job.delay = None
        self._monitor(job.engine).want()
        # Judged now, on the request's task: how busy the proxy is while it replies.
        reason = self._skip_reason() or self._saturated(job.engine)
        if reason is None and job.marks and self._ledger.thrashing(job.engine):
            reason = "evicted_before_use"  # its blocks would go before the step as well
        if reason is not None:
            self._metrics.warmups_skipped.labels(reason).inc()
            if job.delay is None:
                return
        else:
            self._sending.add(key)  # the slot is taken now: the cap holds across awaits
        task = asyncio.get_running_loop().create_task(self._run(job, now=reason is None))
        self._tasks[key], self._jobs[key] = task, job
        task.add_done_callback(functools.partial(self._finished, key))

    def _finished(self, key: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key], self._jobs[key]
            self._sending.discard(key)  # a task cancelled before it ran still had its slot

    def _skip_reason(self) -> str | None:
        return skip_reason(
            self._limits,
            session_busy=False,
            warming=len(self._sending),
            proxy_in_flight=self._in_flight(),
        )

    async def _run(self, job: _Job, *, now: bool) -> None:
        if now:
            await self._attempt(job, engine_checked=False)
        if job.delay is None or job.too_short:
            return
        await self._sleep(job.delay)
        job.trigger = "tool_calls_timed"
        unwanted = self._saturated(job.engine) or self._ledger.skip(job.engine)
        if unwanted is not None:
            self._metrics.warmups_skipped.labels(unwanted).inc()
            return
        # Until the client is expected back, a busy moment is waited out, not a reason to
        # give the warm-up up: vLLM counts a request as waiting until its next scheduler
        # step, so under load one reading often catches one in passing.
        waited = 0.0
        while True:
            if job.client_back:
                self._metrics.warmups_skipped.labels("client_back").inc()
                return
            # The engine first: the proxy's own check and taking the slot then happen
            # with no await in between, so the cap holds.
            reason = await self._engine_busy(job) or self._skip_reason()
            if reason is None:
                break
            if waited + RETRY_S > job.window:
                self._metrics.warmups_skipped.labels(reason).inc()
                return
            await self._sleep(RETRY_S)
            waited += RETRY_S
        self._sending.add(job.session_key)
        await self._attempt(job, engine_checked=True)

    def _saturated(self, engine: str) -> str | None:
        """'engine_saturated' while the engine queued requests in SATURATED_SHARE of its
        recent readings (no idle time to warm in), else None."""
        share = self._monitor(engine).queued_share(self._limits.max_waiting)
        if share is None:
            return None
        self._metrics.engine_queued_share.labels(engine or self._upstream.base_url).set(share)
        return "engine_saturated" if saturated(share) else None

    def _monitor(self, engine: str) -> EngineMonitor:
        monitor = self._monitors.get(engine)
        if monitor is None:
            fetch = functools.partial(self._upstream.call, base=engine)
            monitor = self._monitors[engine] = EngineMonitor(fetch)
        return monitor

    async def _engine_busy(self, job: _Job) -> str | None:
        """Whether the job's engine queues requests (warm-ups would only add to it)."""
        status = await self._monitor(job.engine).fresh(STATUS_MAX_AGE_S)
        return "engine_busy" if engine_busy(self._limits, status.waiting) else None

    async def _attempt(self, job: _Job, *, engine_checked: bool) -> None:
        """One warm-up, unless the engine queues requests; counted whatever happens. The
        caller took the session's slot; this gives it back."""
        try:
            reason = None if engine_checked else await self._engine_busy(job)
            if reason is not None:
                self._metrics.warmups_skipped.labels(reason).inc()
                return
            await self._warm(job)
        finally:
            self._sending.discard(job.session_key)

    async def _warm(self, job: _Job) -> None:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(TIMEOUT_S):
                usage = await self._send(job)
        except Exception as exc:  # a warm-up is never worth more than a count and a line
            self._metrics.warmups.labels(job.trigger, "error").inc()
            if isinstance(exc, (UpstreamError, WarmupFailed, TimeoutError)):
                log.warning("warm-up failed: %s", exc)
            else:
                log.exception("warm-up failed")
            return
        if usage is None:  # skipped once the prompt's length was known
            return
        duration = time.perf_counter() - started
        self._metrics.warmups.labels(job.trigger, "ok").inc()
        self._metrics.warmup_duration.observe(duration)
        counts = token_counts(usage)
        computed = max(counts[0] - counts[1], 0) if counts is not None else 0
        self._metrics.warmup_tokens.inc(computed)
        recomputed = computed >= RECOMPUTE_BLOCKS * self.block_size
        if recomputed:
            previous = self._recompute_s or duration
            self._recompute_s = previous + (duration - previous) * RECOMPUTE_WEIGHT
        if job.trigger == "tool_calls_timed":
            awaited = job.marks and not job.client_back  # its step is still to come
            tokens = job.warmed if awaited else 0
            self._ledger.warmed(
                job.engine, recomputed=recomputed, session=job.session_key, tokens=tokens
            )

    async def _send(self, job: _Job) -> dict[str, Any] | None:
        """Send the warm-up; its usage (possibly empty), or None when it was skipped."""
        if self._token_route:
            try:
                return await self._send_tokens(job)
            except _RouteMissing:
                log.info("the engine has no /tokenize or /v1/completions: warming by chat")
                self._token_route = False
        self._mark_warmed(job, 0)
        payload = chat_body(job.request, job.messages, self._priority)
        return _usage(_checked(*await self._call("/v1/chat/completions", payload, job)))

    async def _send_tokens(self, job: _Job) -> dict[str, Any] | None:
        """Render with /tokenize (once per job), then send the token ids, cut to blocks."""
        if job.tokens is None:
            payload = tokenize_body(job.request, job.messages)
            job.tokens = _tokens(_checked(*await self._call("/tokenize", payload, job)))
        count = warm_length(len(job.tokens), self.block_size)
        if count == 0:
            job.too_short = True
            self._metrics.warmups_skipped.labels("too_short").inc()
            return None
        self._mark_warmed(job, count - 1)  # the last token is computed, not cached
        payload = completion_body(job.request, job.tokens[:count], self._priority)
        return _usage(_checked(*await self._call("/v1/completions", payload, job)))

    async def _call(self, path: str, payload: dict[str, Any], job: _Job) -> tuple[int, bytes]:
        return await self._upstream.call(path, payload, headers=job.credentials, base=job.engine)

    def _mark_warmed(self, job: _Job, tokens: int) -> None:
        job.warmed = tokens
        # Only while the client is still away: its next request reads the flag when it
        # arrives (SessionTracker.open), and a later mark would label the step after it.
        if job.marks and not job.client_back and self._post is not None:
            self._post(job.session_key, functools.partial(_set_warmed, tokens))

    def running(self) -> list[asyncio.Task[None]]:
        """The warm-up tasks in flight or waiting, one per session at most."""
        return list(self._tasks.values())

    async def aclose(self) -> None:
        """Cancel the warm-ups in flight or waiting, and stop reading the engine's metrics."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for monitor in self._monitors.values():
            await monitor.aclose()


def _tokens(body: bytes) -> list[int]:
    try:
        tokens = jsonio.loads(body).get("tokens")
    except (jsonio.InvalidJSON, AttributeError):
        tokens = None
    if not isinstance(tokens, list):
        raise WarmupFailed("/tokenize answered without tokens")
    return tokens


def _usage(body: bytes) -> dict[str, Any]:
    try:
        payload = jsonio.loads(body)
    except jsonio.InvalidJSON:
        return {}
    usage = payload.get("usage") if isinstance(payload, dict) else None
    return usage if isinstance(usage, dict) else {}
