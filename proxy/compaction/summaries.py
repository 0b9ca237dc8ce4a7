"""Summaries being written in the background: one per session at most, each tied to the
part of the conversation it covers, waited for (bounded) when an event needs it.

What to summarize is the compactor's decision; this module only runs the requests, keeps
their tasks, and tells whether one is still good for the conversation as it is now.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from proxy.compaction.planner import Summary, SummaryAsk
from proxy.compaction.summarizer import summarize
from proxy.config import Settings
from proxy.metrics import Metrics
from proxy.upstream import RawHeaders, Upstream

if TYPE_CHECKING:
    from proxy.sessions import Session

log = logging.getLogger("prefill_proxy.compaction")

# A failed summary is not asked for again for this long (per session).
RETRY_S = 30.0


@dataclasses.dataclass
class Pending:
    """A summary being written in the background."""

    task: asyncio.Task[str]
    base: bytes | None  # the cut it extends (the state's cut_key when it started)
    cut_key: bytes  # key of the last message it covers
    cut_index: int
    facts: list[str]

    @property
    def succeeded(self) -> bool:
        task = self.task
        return task.done() and not task.cancelled() and task.exception() is None

    def result(self) -> Summary:
        """The finished summary (call once ``succeeded``)."""
        return Summary(self.task.result(), self.facts, self.cut_key, self.cut_index)


def _failed_now(when: float) -> Callable[[Session], None]:
    def change(session: Session) -> None:
        session.summary_failed_at = when

    return change


class Summaries:
    """The summary tasks of this process (runtime state: tasks cannot be stored). What a
    failure means for the session, a pause before the next try, goes to its record."""

    def __init__(
        self,
        settings: Settings,
        summarizer: Upstream,
        metrics: Metrics,
        *,
        post: Callable[[str, Callable[[Session], None]], None] | None = None,
        clock: Callable[[], float] = time.time,
        own_engine: bool = False,
    ) -> None:
        self._settings = settings
        self._summarizer = summarizer
        self._own_engine = own_engine  # summarizer_url: not the sessions' engines
        self._metrics = metrics
        self._post = post
        self._clock = clock  # wall time: a record's back-off means the same on any replica
        self._pending: dict[str, Pending] = {}

    def get(self, key: str) -> Pending | None:
        return self._pending.get(key)

    def valid(self, key: str, base: bytes | None, keys: Sequence[bytes]) -> Pending | None:
        """The session's summary if it extends ``base`` and covers messages this request
        still has; a stale one is cancelled."""
        pending = self._pending.get(key)
        if pending is None:
            return None
        index = pending.cut_index - 1
        if pending.base != base or index >= len(keys) or keys[index] != pending.cut_key:
            self.drop(key)
            return None
        return pending

    def may_start(self, session: Session) -> bool:
        """Not while one failed for this session a moment ago."""
        failed_at = session.summary_failed_at
        return failed_at is None or self._clock() - failed_at >= RETRY_S

    def start(
        self,
        key: str,
        ask: SummaryAsk,
        credentials: RawHeaders,
        *,
        base: bytes | None,
        engine: str = "",
    ) -> Pending:
        """Start summarizing for session ``key`` (on its ``engine``, unless summaries have
        an engine of their own)."""
        engine = "" if self._own_engine else engine
        task = asyncio.create_task(self._summarize(key, ask.request, credentials, engine))
        task.add_done_callback(_retrieve)
        if len(self._pending) >= self._settings.session_max:  # sessions the store dropped
            self.drop(next(iter(self._pending)))
        pending = Pending(task, base, ask.cut_key, ask.cut_index, ask.facts)
        self._pending[key] = pending
        return pending

    async def wait(self, key: str, pending: Pending) -> str:
        """Wait up to ``summary_wait`` for ``pending``: on_time, late, missing or failed
        (counted)."""
        outcome = "on_time"
        if not pending.task.done():
            waited = time.perf_counter()
            try:
                await asyncio.wait_for(asyncio.shield(pending.task), self._settings.summary_wait)
                outcome = "late"
            except TimeoutError:
                outcome = "missing"
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise  # this request itself is being cancelled
                outcome = "late"  # another request's event cancelled the summary: failed
            except Exception:  # it ended in an error: read from the task below
                outcome = "late"
            self._metrics.compaction_wait.observe(time.perf_counter() - waited)
        if outcome != "missing" and not pending.succeeded:
            outcome = "failed"
            self._pending.pop(key, None)
        self._metrics.summaries.labels(outcome).inc()
        return outcome

    def settled(self, key: str, cut_key: bytes | None) -> None:
        """The session's folded part now ends at ``cut_key``: a summary that does not
        extend it is of no use any more (one that ended there was just used)."""
        pending = self._pending.get(key)
        if pending is not None and pending.base != cut_key:
            if cut_key != pending.cut_key or not pending.succeeded:
                pending.task.cancel()
            self._pending.pop(key, None)

    def running(self) -> list[asyncio.Task[str]]:
        return [pending.task for pending in self._pending.values()]

    def drop(self, key: str) -> None:
        pending = self._pending.pop(key, None)
        if pending is not None:
            pending.task.cancel()

    def close(self) -> None:
        """Cancel the summaries still being written (at shutdown)."""
        for key in list(self._pending):
            self.drop(key)

    async def _summarize(
        self, key: str, request: dict[str, Any], credentials: RawHeaders, engine: str
    ) -> str:
        started = time.perf_counter()
        try:
            text = await summarize(
                self._summarizer,
                request,
                credentials=credentials,
                timeout=self._settings.summary_timeout,
                base=engine,
            )
        except Exception as exc:
            log.warning("summary failed: %s", exc)
            if self._post is not None:
                self._post(key, _failed_now(self._clock()))
            raise
        self._metrics.summary_latency.observe(time.perf_counter() - started)
        return text


def _retrieve(task: asyncio.Task[str]) -> None:
    """Mark a failed summary's error as seen (it was logged and counted when it failed)."""
    if not task.cancelled():
        task.exception()
