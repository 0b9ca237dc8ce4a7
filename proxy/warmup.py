"""Speculative prefill: while the client runs its tools, have the engine compute the next
step's known prefix, so that only the tool results are left to prefill when it comes back.

The shape of a warm-up, from measurements on vLLM 0.32 (CPU build, the test model's
ChatML/Hermes template; tests/e2e/test_warmup_vllm.py keeps checking them):

- ``POST /tokenize`` with the forwarded messages plus the reply as emitted,
  ``add_generation_prompt: false`` and ``continue_final_message: false`` (and the request's
  tools and template fields) renders exactly what the next request will start with: its
  2,728 tokens were the first 2,728 of the next request's 2,760 (which adds the tool
  result and the generation prompt). ``continue_final_message: true`` is not it: it cuts
  the prompt after the reply's content, before the re-rendered tool calls.
- The prompt is then sent as token ids to ``POST /v1/completions``, cut to the largest
  multiple of the block size plus one: vLLM caches full blocks only and always computes
  the last prompt token, so the partial last block would be computed and thrown away.
  Measured: a 2,721-token warm-up (block 32) found 2,688 cached, computed 33, and the next
  step then found 2,720 cached instead of the 2,688 it would have had. The reply's own
  decode blocks did not match: the model's tokens for a tool call are not the template's
  re-rendering of it (tojson arguments), which is why a warm-up pays even on an idle
  engine.
- ``max_tokens: 1`` (vLLM rejects 0); the request's ``cache_salt`` (the same tenant's
  blocks); ``priority`` only when configured (shared/FACTS.md: vLLM refuses it without
  ``--scheduling-policy priority``; 0.32's /v1/completions accepted it here, older ones
  do not).
- Where ``/tokenize`` or ``/v1/completions`` is missing (404), a chat completion with
  ``add_generation_prompt: false`` and ``max_tokens: 1`` warms the same blocks (measured:
  2,720 of 2,728 cached) at the cost of computing the partial last block.

When: right after the reply, and again shortly before the client is expected back, for a
session whose earlier tool rounds say when that is (``warm_delay``). Measured on the
simulator with a KV cache smaller than the sessions' working set
(tests/benchmarks/warmup.py): the warm-up right after the reply alone changed nothing
(TTFT p50 of the steps after tool calls 0.8-1.2x): those blocks were just computed, are
the most recently used, and LRU evicts them during the tool round all the same. The
second one touches (or recomputes) them at the end of the round, when they are needed:
see the benchmark's figures in the commit that added it. The first stays: it is nearly
free (its blocks are cached) and covers what the reply's decode did not (above).

Bounds: one warm-up in flight per session, ``warmup_max_inflight`` in all; skipped while
the engine queues requests (its ``/metrics``, read in the background: proxy.engine) or the
proxy is busy. A warm-up never delays or fails a client request: it is a task of its own,
every failure is caught and counted.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from proxy import jsonio
from proxy.config import Settings
from proxy.engine import EngineMonitor
from proxy.errors import UpstreamError
from proxy.exchange import Exchange, token_counts
from proxy.metrics import Metrics
from proxy.sessions import Session
from proxy.tracker import Turn
from proxy.upstream import RawHeaders, Upstream

log = logging.getLogger("prefill_proxy.warmup")

DEFAULT_BLOCK_SIZE = 16  # vLLM's default on GPUs
# Fields of a chat request that change how its messages render (vLLM's TokenizeChatRequest
# takes the same ones).
RENDER_FIELDS = ("tools", "chat_template", "chat_template_kwargs", "mm_processor_kwargs")
TIMEOUT_S = 120.0  # a warm-up still running after this is no help to anyone
STATUS_MAX_AGE_S = 2.0  # engine readings older than this are refreshed before a warm-up
# The timed warm-up (see the module docstring): how much earlier than the client's expected
# return, and the tool rounds it is worth it for. Tuned on tests/benchmarks/warmup.py.
LEAD_SHARE = 0.25
MIN_LEAD_S = 0.2
MAX_LEAD_S = 2.0
MIN_TIMED_GAP_S = 1.0
GAPS_KEPT = 4  # recent tool rounds per session that the estimate looks at
TRIGGERS = ("tool_calls", "tool_calls_timed", "compaction")


@dataclasses.dataclass(frozen=True)
class Limits:
    max_inflight: int
    max_waiting: int
    max_proxy_inflight: int

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        return cls(
            settings.warmup_max_inflight,
            settings.warmup_max_waiting,
            settings.warmup_max_proxy_inflight,
        )


def skip_reason(
    limits: Limits,
    *,
    session_busy: bool,
    warming: int,
    proxy_in_flight: float,
    engine_waiting: int | None = None,
) -> str | None:
    """Why a warm-up must not go now, or None. An engine that does not say how many
    requests it queues (``None``) is taken as idle."""
    if session_busy:
        return "session_busy"
    if warming >= limits.max_inflight:
        return "global_cap"
    if proxy_in_flight > limits.max_proxy_inflight:
        return "proxy_busy"
    if engine_waiting is not None and engine_waiting > limits.max_waiting:
        return "engine_busy"
    return None


def warm_length(count: int, block_size: int) -> int:
    """How many of a prompt's ``count`` tokens to send: its full blocks plus one token (the
    one vLLM always computes); 0 when not even one block would be cached."""
    full = (count - 1) // block_size * block_size if count > 0 else 0
    return full + 1 if full > 0 else 0


def warm_delay(gaps: Sequence[float]) -> float | None:
    """Seconds after a tool-call reply to warm its prefix a second time, just before the
    client is expected back (the shortest of its recent tool rounds, less a lead for the
    warm-up itself); None without history or when the client comes back too soon for it
    to matter."""
    if not gaps:
        return None
    expected = min(gaps)
    if expected < MIN_TIMED_GAP_S:
        return None
    return expected - min(max(expected * LEAD_SHARE, MIN_LEAD_S), MAX_LEAD_S)


def _common(request: dict[str, Any]) -> dict[str, Any]:
    return {"model": request.get("model")} | {
        field: request[field] for field in RENDER_FIELDS if request.get(field) is not None
    }


def _extra(request: dict[str, Any], priority: int) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if request.get("cache_salt") is not None:
        extra["cache_salt"] = request["cache_salt"]
    if priority:
        extra["priority"] = priority
    return extra


def tokenize_body(request: dict[str, Any], messages: Sequence[Any]) -> dict[str, Any]:
    """The /tokenize request for the rendered conversation, without a generation prompt."""
    return _common(request) | {
        "messages": list(messages),
        "add_generation_prompt": False,
        "continue_final_message": False,
    }


def completion_body(request: dict[str, Any], tokens: Sequence[int], priority: int) -> dict:
    return {"model": request.get("model"), "prompt": list(tokens), "max_tokens": 1} | _extra(
        request, priority
    )


def chat_body(request: dict[str, Any], messages: Sequence[Any], priority: int) -> dict:
    """The fallback: a chat completion of the same prompt, one token long."""
    return (
        _common(request)
        | {"messages": list(messages), "add_generation_prompt": False, "max_tokens": 1}
        | {"stream": False}
        | _extra(request, priority)
    )


def route_missing(status: int, body: bytes) -> bool:
    """A 404/405 from the router (FastAPI's ``{"detail": ...}``), not an OpenAI error such
    as vLLM's 404 for an unknown model."""
    if status not in (404, 405):
        return False
    try:
        payload = jsonio.loads(body)
    except jsonio.InvalidJSON:
        return True
    return not (isinstance(payload, dict) and "error" in payload)


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
    session: Session | None = None
    touched: float = 0.0  # the session's last use when the job was made
    delay: float | None = None  # then warm again this many seconds later (timed)
    tokens: list[int] | None = None  # the rendered prompt, once /tokenize said
    too_short: bool = False


@dataclasses.dataclass
class _Pace:
    """A session's rhythm: when its last tool-call reply went out, how long its recent
    tool rounds took (reply to next request)."""

    replied_at: float | None = None
    gaps: collections.deque[float] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=GAPS_KEPT)
    )


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
        in_flight: Callable[[], float] | None = None,
        monitor: EngineMonitor | None = None,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self._enabled = settings.warmup  # off: only the step TTFTs are observed
        self._limits = Limits.from_settings(settings)
        self._block_size = settings.engine_block_size or None
        self._priority = settings.warmup_priority
        self._upstream = upstream
        self._metrics = metrics
        self._in_flight = in_flight or metrics.in_flight._value.get
        self._monitor = monitor or EngineMonitor(upstream.call)
        self._clock = clock  # the exchanges' clock: tool rounds are measured against it
        self._sleep = sleep
        self._tasks: dict[str, asyncio.Task[None]] = {}  # per session: its warm-up task
        self._sending: set[str] = set()  # sessions whose warm-up request is out now
        self._paces: collections.OrderedDict[str, _Pace] = collections.OrderedDict()
        self._max_paces = settings.session_max
        self._token_route = True  # /tokenize and /v1/completions served (until a 404)

    @property
    def block_size(self) -> int:
        return self._block_size or self._monitor.block_size or DEFAULT_BLOCK_SIZE

    def after_reply(self, turn: Turn, exchange: Exchange) -> None:
        if turn.follows_tool_calls and exchange.first_token_at is not None:
            ttft = exchange.first_token_at - exchange.started
            self._metrics.step_ttft.labels("yes" if turn.warmed else "no").observe(ttft)
        pace = self._pace(turn.session.key)
        if turn.follows_tool_calls and pace.replied_at is not None:
            pace.gaps.append(max(exchange.started - pace.replied_at, 0.0))
        reply = exchange.reply
        if not (reply and reply.get("tool_calls")):
            pace.replied_at = None
            return
        pace.replied_at = self._clock()
        job = _Job(
            turn.request,
            [*turn.forwarded_messages, reply],
            turn.credentials,
            turn.session.key,
            "tool_calls",
            turn.session,
            turn.session.touched,
            delay=warm_delay(pace.gaps),
        )
        self._start(job)

    def warm(
        self,
        request: dict[str, Any],
        credentials: RawHeaders,
        session_key: str,
        trigger: str = "compaction",
    ) -> None:
        """Warm ``request``'s messages (a forwarded chat request) in the background, within
        the same bounds. Returns at once."""
        messages = request.get("messages")
        if isinstance(messages, list) and messages:
            self._start(_Job(request, list(messages), credentials, session_key, trigger))

    def _pace(self, key: str) -> _Pace:
        pace = self._paces.get(key)
        if pace is None:
            pace = self._paces[key] = _Pace()
            while len(self._paces) > self._max_paces:
                self._paces.popitem(last=False)
        self._paces.move_to_end(key)
        return pace

    def _start(self, job: _Job) -> None:
        if not self._enabled:
            self._metrics.warmups_skipped.labels("disabled").inc()
            return
        self._monitor.want()
        key = job.session_key
        if key in self._sending:
            self._metrics.warmups_skipped.labels("session_busy").inc()
            return
        previous = self._tasks.pop(key, None)
        if previous is not None:
            previous.cancel()  # waiting to warm a prefix this newer one extends
        # Judged now, on the request's task: how busy the proxy is while it replies.
        reason = self._skip_reason()
        if reason is not None:
            self._metrics.warmups_skipped.labels(reason).inc()
            if job.delay is None:
                return
        else:
            self._sending.add(key)  # the slot is taken now: the cap holds across awaits
        task = asyncio.get_running_loop().create_task(self._run(job, now=reason is None))
        self._tasks[key] = task
        task.add_done_callback(functools.partial(self._finished, key))

    def _finished(self, key: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
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
            await self._attempt(job)
        if job.delay is None or job.too_short:
            return
        await self._sleep(job.delay)
        if job.session is not None and job.session.touched != job.touched:
            self._metrics.warmups_skipped.labels("client_back").inc()
            return
        job.trigger = "tool_calls_timed"
        reason = self._skip_reason()
        if reason is not None:
            self._metrics.warmups_skipped.labels(reason).inc()
            return
        self._sending.add(job.session_key)
        await self._attempt(job)

    async def _attempt(self, job: _Job) -> None:
        """One warm-up, unless the engine queues requests; counted whatever happens. The
        caller took the session's slot; this gives it back."""
        try:
            await self._warm(job)
        finally:
            self._sending.discard(job.session_key)

    async def _warm(self, job: _Job) -> None:
        status = await self._monitor.fresh(STATUS_MAX_AGE_S)
        if status.waiting is not None and status.waiting > self._limits.max_waiting:
            self._metrics.warmups_skipped.labels("engine_busy").inc()
            return
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
        self._metrics.warmups.labels(job.trigger, "ok").inc()
        self._metrics.warmup_duration.observe(time.perf_counter() - started)
        counts = token_counts(usage)
        if counts is not None:
            self._metrics.warmup_tokens.inc(max(counts[0] - counts[1], 0))

    async def _send(self, job: _Job) -> dict[str, Any] | None:
        """Send the warm-up; its usage (possibly empty), or None when it was skipped."""
        if self._token_route:
            try:
                return await self._send_tokens(job)
            except _RouteMissing:
                log.info("the engine has no /tokenize or /v1/completions: warming by chat")
                self._token_route = False
        self._mark_warmed(job)
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
        self._mark_warmed(job)
        payload = completion_body(job.request, job.tokens[:count], self._priority)
        return _usage(_checked(*await self._call("/v1/completions", payload, job)))

    async def _call(self, path: str, payload: dict[str, Any], job: _Job) -> tuple[int, bytes]:
        return await self._upstream.call(path, payload, headers=job.credentials)

    @staticmethod
    def _mark_warmed(job: _Job) -> None:
        # Only while the client is still away: its next request reads the flag when it
        # arrives (SessionTracker.open), and a later mark would label the step after it.
        if job.session is not None and job.session.touched == job.touched:
            job.session.warmed = True

    async def aclose(self) -> None:
        """Cancel the warm-ups in flight or waiting, and stop reading the engine's metrics."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._monitor.aclose()


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
