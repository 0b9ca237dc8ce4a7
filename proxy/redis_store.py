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

Each replica also keeps the records it last saved, bounded like the in-memory store (a
near copy). The shared record wins whenever the store answers with one; the near copy
serves while the store is down, and when the store has none because it restarted empty
since that save (an epoch key, set by the first save after a start, tells): then as a
new record (version 0: it is created, or loses to one another replica created
meanwhile). A record that expired, was evicted or deleted stays gone. So a store outage
or restart costs this replica's sessions only what they did elsewhere meanwhile.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import secrets
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
EPOCH = PREFIX + "epoch"  # set by the first save after the store starts empty
# After a failure, calls are skipped for this long (each would wait out the timeout).
BACKOFF_S = 1.0
# Session keys longer than this (a client's own X-Session-Id) are hashed into the Redis key.
LONGEST_KEY = 200

# KEYS: record, index, epoch. ARGV: version loaded, value to store, TTL ms, most records,
# an epoch to set if there is none. Returns {-1, epoch} when the stored version differs,
# else {records the index holds, epoch}.
_SAVE = """
redis.call('SET', KEYS[3], ARGV[5], 'NX')
local epoch = redis.call('GET', KEYS[3])
local stored = redis.call('GET', KEYS[1])
local version = 0
if stored then version = tonumber(string.match(stored, '^(%d+):')) or -1 end
if version ~= tonumber(ARGV[1]) then return {-1, epoch} end
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
return {redis.call('ZCARD', KEYS[2]), epoch}
"""


class StoreUnavailable(Exception):
    """The store did not answer in time, or is being skipped after a failure."""


class RedisStore:
    waits = True

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
        self._ttl_s = ttl_s
        # key -> (when saved, the store's epoch then, the record as saved): near copies.
        self._near: collections.OrderedDict[str, tuple[float, bytes, Session]] = (
            collections.OrderedDict()
        )
        self._new_epoch = secrets.token_hex(8).encode()

    async def get(self, key: str) -> Session | None:
        try:
            stored, epoch = await self._call(
                "get", lambda: self._redis.mget(_redis_key(key), EPOCH)
            )
        except StoreUnavailable:
            near = self._near_copy(key, "down")
            if near is None:
                raise
            return near
        if stored is None:
            return self._near_copy(key, "lost", unless_epoch=_bytes(epoch))
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
        keys = [_redis_key(session.key), INDEX, EPOCH]
        args: list[bytes | int] = [
            session.version, value, self._ttl_ms, self._max_sessions, self._new_epoch
        ]  # fmt: skip
        try:
            held, epoch = await self._call("save", lambda: self._save_script(keys=keys, args=args))
        except StoreUnavailable:
            # What this replica knows, for while the store is away (no epoch: any).
            self._keep_near(session, b"")
            raise
        if int(held) < 0:
            return False
        self._held = int(held)
        session.version += 1
        self._keep_near(session, epoch)
        return True

    async def delete(self, key: str) -> None:
        self._near.pop(key, None)
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

    def _keep_near(self, session: Session, epoch: bytes) -> None:
        self._near[session.key] = (self._clock(), epoch, session.copy())
        self._near.move_to_end(session.key)
        while len(self._near) > self._max_sessions:
            self._near.popitem(last=False)

    def _near_copy(
        self, key: str, reason: str, unless_epoch: bytes | None = None
    ) -> Session | None:
        """This replica's copy of a record the store cannot give (``reason``: down, lost),
        as a record new to the store; not when it was saved in the store's current epoch
        (the store did not lose it: it expired or went)."""
        kept = self._near.get(key)
        if kept is None or self._clock() - kept[0] > self._ttl_s:
            return None
        _saved_at, epoch, record = kept
        if unless_epoch is not None and epoch == unless_epoch:
            return None
        self._metrics.store_fallbacks.labels(reason).inc()
        session = record.copy()
        session.version = 0
        return session

    def _encode(self, session: Session) -> bytes | None:
        """The record's bytes within max_bytes: its oldest restored messages go first."""
        data = session_codec.encode(session)
        if len(data) <= self._max_bytes:
            return data
        self._metrics.store_errors.labels("too_large").inc()
        while len(data) > self._max_bytes and session.substitutions:
            session.drop_oldest_substitutions(max(len(session.substitutions) // 4, 1))
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


def _bytes(value: bytes | str | None) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


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
