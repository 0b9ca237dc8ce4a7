"""Session records in Redis or Valkey, shared by every proxy replica (session_store=redis).

A record is stored as ``<version>:<record bytes>`` (proxy.session_codec) under its own key,
with the session TTL; a sorted set indexes the records by their last save, so the store
keeps ``session_max`` of them (least recently saved dropped first) and knows how many it
holds. A save is one Lua script: it compares the stored version with the one the record
was loaded from and writes only if they match (compare and set), so two replicas saving
one session at once never lose each other's reply silently (proxy.tracker re-records the
loser into the winner's record).

Every call is bounded by ``session_store_timeout``; a failed call makes the store skip
calls for a second (requests go on without their session instead of each waiting out
the timeout), then it tries again: the client reconnects by itself. One server (or a
primary with replicas) is expected; the script's two keys would cross slots on Cluster.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from proxy import session_codec
from proxy.metrics import Metrics
from proxy.sessions import Session

log = logging.getLogger("prefill_proxy.redis_store")
T = TypeVar("T")

PREFIX = "prefill-proxy:"
INDEX = PREFIX + "index"
# After a failure, calls are skipped for this long (each would wait out the timeout).
BACKOFF_S = 1.0
# Session keys longer than this (a client's own X-Session-Id) are hashed into the Redis key.
LONGEST_KEY = 200

# KEYS: record, index. ARGV: version loaded, value to store, TTL ms, most records.
# Returns -1 when the stored version differs, else how many records the index holds.
_SAVE = """
local stored = redis.call('GET', KEYS[1])
local version = 0
if stored then version = tonumber(string.match(stored, '^(%d+):')) or -1 end
if version ~= tonumber(ARGV[1]) then return -1 end
local ttl = tonumber(ARGV[3])
redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('ZADD', KEYS[2], now, KEYS[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - ttl)
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[4])
if over > 0 then
  local oldest = redis.call('ZRANGE', KEYS[2], 0, over - 1)
  redis.call('DEL', unpack(oldest))
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, over - 1)
end
return redis.call('ZCARD', KEYS[2])
"""


class StoreUnavailable(Exception):
    """The store did not answer in time, or is being skipped after a failure."""


class RedisStore:
    def __init__(
        self,
        url: str,
        metrics: Metrics,
        *,
        ttl_s: float,
        max_sessions: int,
        max_bytes: int,
        timeout: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._redis = aioredis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 0),  # the request goes on without it instead
            health_check_interval=30,
        )
        self._save_script = self._redis.register_script(_SAVE)
        self._metrics = metrics
        self._ttl_ms = max(int(ttl_s * 1000), 1)
        self._max_sessions = max_sessions
        self._max_bytes = max_bytes
        self._timeout = timeout
        self._clock = clock
        self._skip_until = 0.0
        self._held: int | None = None

    async def get(self, key: str) -> Session | None:
        stored = await self._call("get", lambda: self._redis.get(_redis_key(key)))
        if stored is None:
            return None
        raw = stored if isinstance(stored, bytes) else stored.encode()
        version, _, data = raw.partition(b":")
        try:
            session = session_codec.decode(data)
        except session_codec.CodecError:  # another format: start the session afresh
            self._metrics.store_errors.labels("codec").inc()
            return None
        session.version = int(version)
        return session

    async def save(self, session: Session) -> bool:
        data = self._encode(session)
        if data is None:
            return True  # nothing to keep that fits; the session goes on unsaved
        value = b"%d:%s" % (session.version + 1, data)
        keys = [_redis_key(session.key), INDEX]
        args: list[bytes | int] = [session.version, value, self._ttl_ms, self._max_sessions]
        held = await self._call("save", lambda: self._save_script(keys=keys, args=args))
        if int(held) < 0:
            return False
        self._held = int(held)
        session.version += 1
        return True

    async def delete(self, key: str) -> None:
        redis_key = _redis_key(key)
        await self._call("delete", lambda: self._redis.delete(redis_key))

    def held(self) -> int | None:
        return self._held

    async def ping(self) -> bool:
        try:
            return bool(await self._call("ping", self._redis.ping))
        except Exception:
            return False

    async def aclose(self) -> None:
        await self._redis.aclose()

    def _encode(self, session: Session) -> bytes | None:
        """The record's bytes within max_bytes: its oldest restored messages go first."""
        data = session_codec.encode(session)
        if len(data) <= self._max_bytes:
            return data
        self._metrics.store_errors.labels("too_large").inc()
        substitutions = session.substitutions
        while len(data) > self._max_bytes and substitutions:
            for _ in range(max(len(substitutions) // 4, 1)):
                substitutions.popitem(last=False)
            data = session_codec.encode(session)
        if len(data) > self._max_bytes:
            log.warning("session %s: record over %d bytes, not saved", session.key, self._max_bytes)
            return None
        return data

    async def _call(self, op: str, call: Callable[[], Awaitable[T]]) -> T:
        """One store call, timed, bounded and counted; raises StoreUnavailable."""
        if self._clock() < self._skip_until:
            self._metrics.store_errors.labels("skipped").inc()
            raise StoreUnavailable("session store skipped after a recent failure")
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self._timeout):
                result = await call()
        except (TimeoutError, RedisTimeoutError) as exc:
            raise self._failed("timeout", exc) from exc
        except RedisConnectionError as exc:
            raise self._failed("connection", exc) from exc
        except RedisError as exc:
            raise self._failed("protocol", exc) from exc
        self._metrics.store_latency.labels(op).observe(time.perf_counter() - started)
        return result

    def _failed(self, kind: str, exc: BaseException) -> StoreUnavailable:
        self._metrics.store_errors.labels(kind).inc()
        self._skip_until = self._clock() + BACKOFF_S
        return StoreUnavailable(f"session store {kind}: {type(exc).__name__}: {exc}")


def _redis_key(key: str) -> str:
    if len(key) > LONGEST_KEY:
        key = "long:" + hashlib.blake2b(key.encode(), digest_size=16).hexdigest()
    return PREFIX + "s:" + key


def describe(url: str) -> str:
    """``url`` without its password, for the log."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.rpartition("@")[2]
    return scheme + sep + rest
