"""Which engine a request goes to, when the proxy fronts several (upstream with commas, or
one DNS name re-resolved: a Kubernetes headless Service).

A conversation's KV blocks live on one engine, so a chat request goes to its session's
engine. A new session is placed by rendezvous (highest-random-weight) hashing over the
engines: every replica computes the same ranking without talking to the others, and
adding or removing an engine moves only the sessions that ranked it first. The key
hashed is the session's prefix family (its system prompt and tools: conversations that
share them share KV blocks, computed once on an engine they share) or, with
``engine_placement=session``, its own key. Loads are bounded: a new session skips an
engine carrying more than ``engine_spread_load`` requests and more than 1.25x the
engines' mean (consistent hashing with bounded loads), so one family spreads once it
would crowd an engine. The engine is then part of the session's record: a session whose
engine fails its probe, is refused by it, or reports more than ``engine_max_waiting``
waiting requests moves to the next usable engine of its ranking and stays there; an
engine coming back gets new sessions, the old ones stay where they went. Requests
without a session (models, embeddings, tokenize) go to the least-loaded usable engine.

Decisions are pure (``place``, ``least_loaded``); ``Engines.run`` does the probing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import re
import socket
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence

from proxy.metrics import Metrics

log = logging.getLogger("prefill_proxy.engines")

# vLLM's gauges of requests waiting for a slot and running (its /metrics).
_WAITING = re.compile(rb"^vllm:num_requests_waiting(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)
_RUNNING = re.compile(rb"^vllm:num_requests_running(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)
# A new session skips an engine above this multiple of the mean load (and the floor).
LOAD_BOUND = 1.25


@dataclasses.dataclass
class Engine:
    url: str
    healthy: bool = True
    waiting: float = 0.0  # the engine's own queue, from its /metrics
    running: float = 0.0  # and its running batch
    in_flight: int = 0  # this proxy's requests on it now

    @property
    def load(self) -> float:
        """What it carries, as last probed, plus this proxy's requests on it (counted
        twice until the next probe: better a little early to spread than a herd)."""
        return self.running + self.waiting + self.in_flight

    def unusable(self, max_waiting: float) -> str:
        """Why it should take no session now ('' when it may)."""
        if not self.healthy:
            return "unhealthy"
        if max_waiting and self.waiting > max_waiting:
            return "overloaded"
        return ""


def weight(key: str, url: str) -> int:
    """The rendezvous weight of engine ``url`` for session ``key``."""
    digest = hashlib.blake2b(f"{key}\x00{url}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def ranking(key: str, engines: Sequence[Engine]) -> list[Engine]:
    return sorted(engines, key=lambda engine: weight(key, engine.url), reverse=True)


@dataclasses.dataclass(frozen=True)
class Placement:
    engine: Engine
    decision: str  # new, affinity, moved
    reason: str = ""  # why it moved: unhealthy, overloaded, removed


def place(
    key: str,
    current: str,
    engines: Sequence[Engine],
    max_waiting: float,
    spread_load: float = 0.0,
) -> Placement:
    """Where a session ranked by ``key`` and now on engine ``current`` ('' for none yet)
    goes. A new or moving session takes the first engine of its ranking that is usable
    and within the load bound (``spread_load`` and LOAD_BOUND x the mean; 0: no bound),
    else the least loaded usable one."""
    by_url = {engine.url: engine for engine in engines}
    stays = by_url.get(current)
    if stays is not None and not stays.unusable(max_waiting):
        return Placement(stays, "affinity")
    ranked = ranking(key, engines)
    usable = [e for e in ranked if not e.unusable(max_waiting)]
    chosen = None
    if usable:
        bound = max(spread_load, LOAD_BOUND * sum(e.load for e in usable) / len(usable))
        within = [e for e in usable if not spread_load or e.load < bound]
        chosen = within[0] if within else min(usable, key=lambda e: e.load)
    if chosen is None:  # none usable: stay, or the top of the ranking (the request will say)
        return Placement(stays or ranked[0], "affinity" if stays else "new")
    if not current:
        return Placement(chosen, "new")
    if stays is None:
        return Placement(chosen, "moved", "removed")
    return Placement(chosen, "moved", stays.unusable(max_waiting))


def least_loaded(engines: Sequence[Engine], max_waiting: float) -> Engine:
    usable = [e for e in engines if not e.unusable(max_waiting)] or list(engines)
    return min(usable, key=lambda engine: (engine.load, engine.url))


Resolve = Callable[[str, int], Awaitable[list[str]]]


async def resolve_addresses(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class Engines:
    """The engines and what the proxy knows of them; probed by ``run`` while it serves."""

    def __init__(
        self,
        urls: Sequence[str],
        metrics: Metrics,
        *,
        max_waiting: float = 0.0,
        spread_load: float = 0.0,
        probe_interval: float = 2.0,
        health_path: str = "/health",
        dns_refresh: float = 0.0,
        resolve: Resolve = resolve_addresses,
    ) -> None:
        self.engines = [Engine(url) for url in urls]
        self._metrics = metrics
        self._max_waiting = max_waiting
        self._spread_load = spread_load
        self._interval = probe_interval
        self._health_path = health_path
        self._dns_refresh = dns_refresh
        self._resolve = resolve
        self._dns_url = urls[0] if dns_refresh > 0 else ""
        metrics.engines_healthy.set_function(lambda: sum(e.healthy for e in self.engines))

    @property
    def probed(self) -> bool:
        """Whether there is a choice to make (one static engine is never probed)."""
        return len(self.engines) > 1 or bool(self._dns_url)

    def for_session(self, key: str, current: str, *, recorded: bool = True) -> Placement:
        """Where a session ranked by ``key``, now on ``current``, goes; ``recorded=False``
        for a chat request without its session record (counted as no_session)."""
        placement = place(key, current, self.engines, self._max_waiting, self._spread_load)
        if self.probed:
            decision = (placement.decision, placement.reason) if recorded else ("no_session", "")
            self._metrics.routing.labels(*decision).inc()
        return placement

    def for_request(self) -> Engine:
        if self.probed:
            self._metrics.routing.labels("no_session", "").inc()
        return least_loaded(self.engines, self._max_waiting)

    def refused(self, engine: Engine) -> None:
        """A connection to it failed: take it out until a probe finds it again."""
        if engine.healthy and self.probed:
            log.warning(
                "engine %s refused a connection; skipped until its probe passes", engine.url
            )
            engine.healthy = False

    async def resolve(self) -> None:
        """With dns_refresh, the name's addresses now (at start-up, so the first requests
        go to them rather than to the name)."""
        if self._dns_url:
            async with asyncio.timeout(5.0):
                await self._re_resolve()

    async def run(self, get: Callable[[str, str], Awaitable[tuple[int, bytes]]]) -> None:
        """Probe every engine each interval (``get(base, path)`` -> status, body); with
        dns_refresh, re-resolve the name too (first after one interval of dns_refresh:
        ``resolve`` did it at start-up)."""
        if not self.probed:
            return
        loop = asyncio.get_running_loop()
        next_resolve = loop.time() + self._dns_refresh
        while True:
            if self._dns_url and loop.time() >= next_resolve:
                await self._re_resolve()
                next_resolve = loop.time() + self._dns_refresh
            await asyncio.gather(*(self._probe(engine, get) for engine in list(self.engines)))
            await asyncio.sleep(self._interval)

    async def _probe(
        self, engine: Engine, get: Callable[[str, str], Awaitable[tuple[int, bytes]]]
    ) -> None:
        try:
            status, _ = await get(engine.url, self._health_path)
            healthy = status < 400
            if healthy:  # its load, for placing new sessions
                status, body = await get(engine.url, "/metrics")
                if status == 200:
                    engine.waiting = sum(float(v) for v in _WAITING.findall(body))
                    engine.running = sum(float(v) for v in _RUNNING.findall(body))
        except Exception:  # any failure to answer is unhealthy
            healthy = False
        if healthy != engine.healthy:
            log.warning("engine %s is %s", engine.url, "healthy" if healthy else "unhealthy")
        engine.healthy = healthy

    async def _re_resolve(self) -> None:
        parsed = urllib.parse.urlsplit(self._dns_url)
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            addresses = await self._resolve(parsed.hostname or "", port)
        except OSError as exc:
            log.warning("cannot resolve %s (%s); keeping the engines known", parsed.hostname, exc)
            return
        if not addresses:
            return
        urls = [f"{parsed.scheme}://{_host(address)}:{port}" for address in sorted(addresses)]
        known = {engine.url: engine for engine in self.engines}
        if set(urls) != set(known):
            log.info("engines of %s: %s", parsed.hostname, ", ".join(urls))
            self.engines = [known.get(url) or Engine(url) for url in urls]


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address
