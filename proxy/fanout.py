"""Fan-out holds: of concurrent requests that share a long, uncached prompt prefix, the
first goes upstream and the others wait for its first token, when the engine has the
prefix cached, instead of each computing it.

Which requests share a prefix. An agent that starts sub-agents together sends each the
same system prompt and tools, often the same context, and its own task last. So the key
is an exact hash of everything the chat template renders before the newest message:
model, tools, ``chat_template_kwargs``, ``cache_salt`` and ``messages[:-1]``. It costs one
serialization and one hash of the request's head, O(request size), and only for the
requests that can need it:

- A request that continues its session's previous prompt (``exchange.prefix_break ==
  "none"``, set by proxy.tracker before the gate is asked) has its prefix cached by its
  own previous step: it is never held and computes no key. That is the normal case, one
  session stepping, and it costs a string comparison.
- A head shorter than ``fanout_min_tokens`` (estimated as bytes / 4 of its JSON) is not
  worth a wait.
- A key whose leader reached its first token in the last ``cached_ttl`` seconds is known
  to be cached: not held.

Not covered: requests whose shared part ends inside the newest message (one long user
message with the task at its end); finding that would mean comparing texts across
requests, and sub-agent frameworks put the task in a message of its own.

Holding. The first request with a key leads; it registers a callback on its exchange's
``on_first_token``, which proxy.exchange calls at the first streamed token or, failing
that, when the exchange ends (a non-streamed reply, an error, a client gone). Others with
the key wait for that (``asyncio.wait_for`` on an Event), at most ``hold`` seconds in all,
then go. A leader that ended without a token (error, disconnect) has cached nothing: its
followers elect a new leader among themselves, the first of them to wake, and wait on it
within what is left of their hold. Followers register nothing, so a follower whose task
is cancelled leaves no trace; leaders are forgotten when their exchange ends, and both
tables are bounded in size and age, so an exchange that never ends cannot grow them.

Where it pays. Only where the engine computes a shared prefix once per request scheduled
in the same step: vLLM V0 and engines that reuse KV only once a request's prefill is done,
when the fan-out lands in one step (it queued behind other work): each request of it
then computes the prefix, up to the step's token budget. vLLM V1 caches a block when the
step that computes it is scheduled (``allocate_slots`` in ``vllm/v1/core/
kv_cache_manager.py``), so requests admitted in the same or a later step share it (the
simulator does the same): there a hold saves no prefill and delays the followers by about
one engine step and a proxy hop. tests/benchmarks/fanout.py measures both.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import time
from collections.abc import Callable
from typing import Any

from proxy import jsonio
from proxy.exchange import Exchange
from proxy.metrics import Metrics
from proxy.tokens import CHARS_PER_TOKEN

CACHED_TTL = 60.0  # seconds a key counts as cached after its leader's first token
MAX_KEYS = 4096  # leaders in flight, and keys remembered as cached


def prefix_key(request: dict[str, Any], min_tokens: int) -> bytes | None:
    """The hash of what ``request`` renders before its newest message, or None when that
    is shorter than ``min_tokens`` (estimated) or the request has no messages."""
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    head = jsonio.dumps(
        [
            request.get("model"),
            request.get("tools"),
            request.get("chat_template_kwargs"),
            request.get("cache_salt"),
            messages[:-1],
        ]
    )
    if len(head) < min_tokens * CHARS_PER_TOKEN:
        return None
    return hashlib.blake2b(head, digest_size=16).digest()


@dataclasses.dataclass(eq=False)
class _Leader:
    exchange: Exchange
    since: float
    released: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    cached: bool = False  # set with ``released``: whether it reached a first token


class FanoutGate:
    """Holds requests behind a concurrent leader with the same uncached prefix key.
    Metrics: ``fanout_holds{outcome}``, released (the leader's first token came, or it
    ended and this request went on or took over) or timeout; ``fanout_hold_time``."""

    def __init__(
        self,
        hold: float,
        min_tokens: int,
        metrics: Metrics,
        *,
        cached_ttl: float = CACHED_TTL,
        max_keys: int = MAX_KEYS,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.hold = hold
        self.min_tokens = min_tokens
        self._metrics = metrics
        self._cached_ttl = cached_ttl
        # A leader older than this is presumed lost (its exchange never ended).
        self._leader_ttl = max(CACHED_TTL, 10 * hold)
        self._max_keys = max_keys
        self._clock = clock
        self._leaders: dict[bytes, _Leader] = {}  # in arrival order
        self._cached: dict[bytes, float] = {}  # key -> when cached, in that order

    @property
    def leaders(self) -> int:
        """Keys with a leader in flight (tests, debugging)."""
        return len(self._leaders)

    async def admit(self, request: dict[str, Any], exchange: Exchange) -> None:
        """Return when ``request`` may go upstream: at once, or after a hold."""
        if self.hold <= 0 or exchange.prefix_break == "none":
            return
        key = prefix_key(request, self.min_tokens)
        if key is None:
            return
        started = self._clock()
        self._expire(started)
        leader = self._leaders.get(key)
        if leader is not None and leader.exchange is exchange:
            return  # never behind itself
        if leader is None:
            if key not in self._cached:
                self._lead(key, exchange, started)
            return
        outcome = await self._follow(key, leader, exchange, started + self.hold)
        held = self._clock() - started
        exchange.held_s = held
        self._metrics.fanout_holds.labels(outcome).inc()
        self._metrics.fanout_hold_time.observe(held)

    async def _follow(
        self, key: bytes, leader: _Leader, exchange: Exchange, deadline: float
    ) -> str:
        """Wait for ``leader``; if it ends without caching the prefix, for its successor."""
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0:
                return "timeout"
            try:
                await asyncio.wait_for(leader.released.wait(), remaining)
            except TimeoutError:
                return "timeout"
            if leader.cached:
                return "released"
            successor = self._leaders.get(key)
            if successor is None:  # the first follower to wake leads now
                if key not in self._cached:
                    self._lead(key, exchange, self._clock())
                return "released"
            leader = successor

    def _lead(self, key: bytes, exchange: Exchange, now: float) -> None:
        if len(self._leaders) >= self._max_keys:
            return  # bounded: beyond this, requests go unheld
        leader = _Leader(exchange, now)
        self._leaders[key] = leader
        exchange.on_first_token.append(functools.partial(self._release, key, leader))

    def _release(self, key: bytes, leader: _Leader) -> None:
        """The leader's first token came, or its exchange ended without one."""
        exchange = leader.exchange
        leader.cached = exchange.first_token_at is not None or (
            exchange.status == 200 and not exchange.error_kind and not exchange.client_disconnected
        )
        if self._leaders.get(key) is leader:
            del self._leaders[key]
        if leader.cached:
            self._cached.pop(key, None)  # re-inserted last: the newest
            self._cached[key] = self._clock()
            while len(self._cached) > self._max_keys:
                del self._cached[next(iter(self._cached))]
        leader.released.set()

    def _expire(self, now: float) -> None:
        """Drop cached marks past their TTL and leaders presumed lost (oldest first)."""
        while self._cached:
            key, since = next(iter(self._cached.items()))
            if now - since < self._cached_ttl:
                break
            del self._cached[key]
        while self._leaders:
            key, leader = next(iter(self._leaders.items()))
            if now - leader.since < self._leader_ttl:
                break
            del self._leaders[key]
            leader.released.set()  # its followers go on (and elect a successor)
