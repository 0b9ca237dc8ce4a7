"""How many tokens a session may use: the context limit and the watermarks on it, and the
token estimate of a prompt that the watermarks are compared with."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from proxy import jsonio
from proxy.config import Settings
from proxy.errors import UpstreamError
from proxy.tokens import Counter
from proxy.upstream import Upstream

log = logging.getLogger("prefill_proxy.compaction")

# Framing tokens a chat template adds around each message (role markers, separators).
PER_MESSAGE = 4
# After a failed /v1/models lookup, wait this long before asking again.
RETRY_S = 30.0


@dataclasses.dataclass(frozen=True)
class Budget:
    limit: int
    high: int  # compact when a prompt would cross this
    soft: int  # start the next summary past this
    window: int  # newest turns kept verbatim

    @classmethod
    def of(cls, limit: int, settings: Settings) -> Budget:
        return cls(
            limit,
            int(limit * settings.compaction_high),
            int(limit * settings.compaction_soft),
            int(limit * settings.compaction_window),
        )


class ContextLimits:
    """The context length of each model: the setting, else the upstream's ``max_model_len``
    from /v1/models (vLLM reports it), asked once per model."""

    def __init__(
        self, settings: Settings, upstream: Upstream, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._fixed = settings.context_limit or None
        self._upstream = upstream
        self._known: dict[str, int] = {}
        self._failed_at: float | None = None
        self._lock = asyncio.Lock()
        self._clock = clock

    def known(self, model: str) -> int | None:
        """The limit if it is known now, without asking the upstream."""
        return self._fixed if self._fixed is not None else self._known.get(model)

    async def get(self, model: str) -> int | None:
        if self._fixed is not None:
            return self._fixed
        if model in self._known:
            return self._known[model]
        if self._failed_at is not None and self._clock() - self._failed_at < RETRY_S:
            return None
        async with self._lock:  # one lookup at a time: the first request of many does it
            if model not in self._known:
                await self._lookup()
        return self._known.get(model)

    async def _lookup(self) -> None:
        try:
            status, body = await self._upstream.call("/v1/models", timeout=10.0)
            models = jsonio.loads(body).get("data") if status == 200 else None
        except (UpstreamError, jsonio.InvalidJSON, AttributeError) as exc:
            log.warning("cannot read the context length from /v1/models: %s", exc)
            models = None
        if not isinstance(models, list):
            self._failed_at = self._clock()
            return
        self._failed_at = None
        for entry in models:
            if isinstance(entry, dict) and isinstance(entry.get("max_model_len"), int):
                self._known[str(entry.get("id"))] = entry["max_model_len"]


TOOL_SETS_KEPT = 256  # distinct tool lists whose counts a proxy keeps (least recent dropped)


class Sizer:
    """Token estimates of messages, kept by message key so each message is counted once.

    tiktoken's count is not the engine's: ``ratio`` (engine prompt tokens over this
    estimate, from the session's last reply) corrects it."""

    def __init__(self, counter: Counter) -> None:
        self._counter = counter
        # Tools by their bytes: an agent sends the same ones on every step, and counting
        # them (9 KB for 14 tools) was the largest per-request cost of a small step.
        self._tools: collections.OrderedDict[bytes, int] = collections.OrderedDict()

    async def ready(self) -> None:
        """The counter built, off the event loop where it is built on first use
        (tokens.Lazy)."""
        load = getattr(self._counter, "load", None)
        if load is not None:
            await load()

    def message(self, message: Any) -> int:
        if not isinstance(message, dict):
            return PER_MESSAGE
        text = message.get("content")
        count = PER_MESSAGE
        if isinstance(text, str):
            count += self._counter.count(text)
        elif text is not None:
            count += self._counter.count(jsonio.dumps(text).decode())
        if message.get("tool_calls"):
            count += self._counter.count(jsonio.dumps(message["tool_calls"]).decode())
        return count

    def messages(
        self, messages: Sequence[Any], keys: Sequence[bytes], cache: dict[bytes, int]
    ) -> list[int]:
        """Sizes of ``messages`` (keys: one per message); ``cache`` is filled and pruned."""
        sizes = []
        for message, key in zip(messages, keys, strict=True):
            size = cache.get(key)
            if size is None:
                size = cache[key] = self.message(message)
            sizes.append(size)
        self.prune(cache, keys)
        return sizes

    @staticmethod
    def prune(cache: dict[bytes, int], keys: Sequence[bytes]) -> None:
        """Drop from ``cache`` what the conversation (``keys``) no longer has, once it
        holds twice as much."""
        if len(cache) > 2 * len(keys) + 64:
            wanted = set(keys)
            for key in [k for k in cache if k not in wanted]:
                del cache[key]

    def tools(self, tools: Any) -> int:
        if not tools:
            return 0
        encoded = jsonio.dumps(tools)
        digest = hashlib.blake2b(encoded, digest_size=16).digest()  # bounded memory
        count = self._tools.get(digest)
        if count is None:
            count = self._tools[digest] = self._counter.count(encoded.decode())
            if len(self._tools) > TOOL_SETS_KEPT:
                self._tools.popitem(last=False)
        else:
            self._tools.move_to_end(digest)
        return count
