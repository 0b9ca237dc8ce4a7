"""Compaction of long sessions: rarely, in big steps, with a byte-stable prefix between.

Per request (``apply``, after the rewrite pipeline): build the session's compacted view
(proxy.compaction.state) and estimate its tokens. Past the soft watermark, the next
summary is started in the background. Past the high watermark, a compaction event:

1. old, large tool results become short stand-ins (no model call); if that brings the
   prompt under the soft watermark, that is the event;
2. otherwise the turns between the pinned head and the recent window are replaced by the
   running summary, which is ready by then (started at the soft watermark), or waited for
   up to ``summary_wait`` seconds;
3. with no summary, or still over the high watermark, the oldest turns are dropped behind
   a marker (with the ids and amounts they held).

A request is never made longer than the client's, and if even the pinned head plus the
newest turn is over the engine's limit the client's request goes unchanged: the engine's
own error is the right answer.

After a reply (``after_reply``): calibrate the token estimate with the engine's count, and
if the next request will cross the high watermark and its summary is ready, decide the
event now and warm the compacted prompt in the engine while the client runs its tools.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from proxy.compaction import bounds
from proxy.compaction.budget import Budget, ContextLimits, Sizer
from proxy.compaction.planner import Planner, Snapshot, Summary
from proxy.compaction.state import Compaction, View, find_cut
from proxy.compaction.summaries import Pending, Summaries
from proxy.config import Settings
from proxy.exchange import Exchange, token_counts
from proxy.metrics import Metrics
from proxy.transcript import Mask, next_key
from proxy.upstream import RawHeaders, Upstream

if TYPE_CHECKING:
    from proxy.sessions import Session
    from proxy.turn import Turn

# A result for a session's record (SessionTracker.post).
Post = Callable[[str, Callable[["Session"], None]], None]
log = logging.getLogger("prefill_proxy.compaction")

# Prompts shorter than this (about 4 characters a token) are never compacted, whatever
# the model: every model served has a longer context.
NEVER_COMPACTED = 1024
# Estimate-to-engine ratios outside this range are ignored (a reply from another model).
RATIO_RANGE = (0.5, 3.0)


class Warmer(Protocol):
    def warm(
        self,
        request: dict[str, Any],
        credentials: RawHeaders,
        session_key: str,
        trigger: str = "compaction",
        engine: str = "",
    ) -> None: ...


class Compactor:
    """The driver: per request and after each reply, it gathers what the planner needs
    (the context limit, a finished summary) and applies the planner's decisions to the
    session's record, which the tracker saves with the reply."""

    def __init__(
        self,
        settings: Settings,
        upstream: Upstream,
        metrics: Metrics,
        *,
        sizer: Sizer,
        summarizer: Upstream | None = None,
        mask: Mask | None = None,
        warmer: Warmer | None = None,
        post: Post | None = None,
    ) -> None:
        self.settings = settings
        self.limits = ContextLimits(settings, upstream)
        self.planner = Planner(settings, sizer, in_context=summarizer is None)
        self.summaries = Summaries(
            settings, summarizer or upstream, metrics, post=post, own_engine=summarizer is not None
        )
        self.metrics = metrics
        self.mask = mask
        self.warmer = warmer
        self._budgets: dict[int, Budget] = {}  # by context limit: a few models at most

    @property
    def sizer(self) -> Sizer:
        return self.planner.sizer

    def _budget(self, limit: int) -> Budget:
        """The watermarks for ``limit``, worked out once (a frozen dataclass made per
        request was half of what a request far below them cost here)."""
        budget = self._budgets.get(limit)
        if budget is None:
            budget = self._budgets[limit] = Budget.of(limit, self.settings)
        return budget

    def close(self) -> None:
        """Cancel the summaries still being written (at shutdown)."""
        self.summaries.close()

    # -- per request ---------------------------------------------------------------------

    async def apply(
        self, request: dict[str, Any], turn: Turn, exchange: Exchange
    ) -> dict[str, Any]:
        """The request to forward: ``request`` itself, or a compacted copy."""
        messages = request.get("messages")
        if not isinstance(messages, list) or len(messages) != len(turn.keys):
            return request
        model = str(request.get("model") or "")
        if self.limits.known(model) is None and _rough_tokens(messages) < NEVER_COMPACTED:
            return request  # too short to matter: no need to ask the engine its limit yet
        limit = await self.limits.get(model)
        if limit is None:
            return request
        budget = self._budget(limit)
        session = turn.session
        state = session.compaction
        if state is None:
            state = session.compaction = Compaction()
        # What this step forwards, counted (the reply's count calibrates the estimate with
        # it); stays 0 where it was not counted or is not what goes out.
        state.last_estimate = 0
        sizer, tools = self.planner.sizer, request.get("tools")
        shortcut = bounds.may_skip(state, turn, messages)
        if shortcut and bounds.bounded_below(state, turn, messages, budget, tools):
            return request  # nothing to count
        await sizer.ready()
        if shortcut and bounds.counted_far_below(state, turn.keys, messages, budget, sizer, tools):
            return request
        snap = self.planner.snapshot(messages, turn.keys, state, request.get("tools"))
        cut = find_cut(state, snap.keys)
        if cut is None:  # the client changed the folded part: what was folded is gone
            state = session.compaction = Compaction(sizes=state.sizes, ratio=state.ratio)
            self.summaries.drop(session.key)
            cut = 0
        current = self.planner.view(state, snap, cut)
        estimate = self.planner.estimate(current, snap, state)
        if estimate > budget.high:
            ready, reason = await self._summary_for(state, snap, budget, cut, turn, request)
            new, kind, fallback = self.planner.transition(state, snap, budget, cut, ready)
            if not kind:  # nothing left to compact
                if estimate > budget.limit:
                    self.metrics.compaction_fallbacks.labels("too_long").inc()
                    return request
                return self._with(request, current, snap, state)
            new, compacted, after = self.planner.settle(new, snap, budget)
            if after > budget.limit:  # even head + newest turn: let the engine say so
                self.metrics.compaction_fallbacks.labels("too_long").inc()
                return request
            if after >= estimate:  # nothing gained: keep the prefix the engine has cached
                return self._with(request, current, snap, state)
            fallback = fallback or (reason if kind == "fallback" else "")
            self._commit(session, new, kind, fallback, estimate, after)
            exchange.compaction = kind
            state, current = new, compacted
        else:
            if state.unreported:  # decided after the last reply: this request carries it
                exchange.compaction, state.unreported = state.unreported, ""
            if estimate > budget.soft:
                self._start_summary(state, snap, budget, cut, turn, request)
        return self._with(request, current, snap, state)

    @staticmethod
    def _with(
        request: dict[str, Any], current: View, snap: Snapshot, state: Compaction
    ) -> dict[str, Any]:
        """``request`` with the messages of ``current``, which ``state`` (the session's
        compaction now) records as this step's count."""
        state.last_estimate = sum(current.sizes) + snap.tools_tokens
        if current.messages == request["messages"]:
            return request
        return {**request, "messages": current.messages}

    # -- after a reply -------------------------------------------------------------------

    def after_reply(self, turn: Turn, exchange: Exchange) -> None:
        state = turn.session.compaction
        if state is None:
            return
        counts = token_counts(exchange.usage)
        if counts is not None and counts[0] and state.last_estimate:
            ratio = counts[0] / state.last_estimate
            if RATIO_RANGE[0] <= ratio <= RATIO_RANGE[1]:
                state.ratio = ratio
        if counts is None:
            return
        used = counts[0] + counts[2]
        # What the client added since the last reply: the next step will add about as much.
        growth = max(counts[0] - state.last_used, 0) if state.last_used else 0
        state.last_used = used
        if self.warmer is not None and exchange.reply is not None:
            self._decide_ahead(state, turn, exchange, used + growth)

    def _decide_ahead(
        self, state: Compaction, turn: Turn, exchange: Exchange, predicted: int
    ) -> None:
        """If the next request will cross the high watermark and its summary is ready,
        make the event now and warm its prompt: the client is busy with its tools."""
        limit = self.limits.known(str(turn.request.get("model") or ""))
        pending = self.summaries.get(turn.session.key)
        if limit is None or pending is None or not pending.succeeded:
            return
        budget = self._budget(limit)
        if predicted <= budget.high:
            return
        aligned = turn.rewritten_messages or turn.forwarded_messages
        if len(aligned) != len(turn.keys) or not turn.keys:
            return
        reply = exchange.reply
        messages = [*aligned, reply]
        keys = [*turn.keys, next_key(turn.keys[-1], reply, self.mask)]
        snap = self.planner.snapshot(messages, keys, state, turn.request.get("tools"))
        cut = find_cut(state, keys)
        if cut is None or pending.base != state.cut_key:
            return
        new, kind, fallback = self.planner.transition(state, snap, budget, cut, pending.result())
        if kind in ("", "fallback") or fallback:
            return  # the request itself decides, with its summary_wait
        before = self.planner.estimate(self.planner.view(state, snap, cut), snap, state)
        new, compacted, after = self.planner.settle(new, snap, budget)
        if after >= before:
            return
        new.unreported = kind
        if kind == "summary":  # ready before it was needed
            self.metrics.summaries.labels("on_time").inc()
        self._commit(turn.session, new, kind, "", before, after)
        warm = {**turn.request, "messages": compacted.messages}
        self.warmer.warm(  # type: ignore[union-attr]
            warm, turn.credentials, turn.session.key, "compaction", turn.session.engine
        )

    # -- decisions -----------------------------------------------------------------------

    # -- summaries -----------------------------------------------------------------------

    async def _summary_for(
        self,
        state: Compaction,
        snap: Snapshot,
        budget: Budget,
        cut: int,
        turn: Turn,
        request: dict[str, Any],
    ) -> tuple[Summary | None, str]:
        """The summary for an event now: (ready summary or None, fallback reason)."""
        key = turn.session.key
        pending = self._start_summary(state, snap, budget, cut, turn, request)
        if pending is None:
            return None, "summary_failed"
        outcome = await self.summaries.wait(key, pending)
        if outcome in ("on_time", "late"):
            return pending.result(), ""
        return None, "summary_late" if outcome == "missing" else "summary_failed"

    def _start_summary(
        self,
        state: Compaction,
        snap: Snapshot,
        budget: Budget,
        cut: int,
        turn: Turn,
        request: dict[str, Any],
    ) -> Pending | None:
        """The session's summary of the turns before the window: the one being written,
        or a new one."""
        session = turn.session
        pending = self.summaries.valid(session.key, state.cut_key, snap.keys)
        if pending is not None or not self.summaries.may_start(session):
            return pending
        ask = self.planner.summary_ask(state, snap, budget, cut, request)
        if ask is None:
            return None
        return self.summaries.start(
            session.key, ask, turn.credentials, base=state.cut_key, engine=session.engine
        )

    # -- bookkeeping ---------------------------------------------------------------------

    def _commit(
        self, session: Session, new: Compaction, kind: str, fallback: str, before: int, after: int
    ) -> None:
        """Make ``new`` the session's compaction: an event of ``kind`` (counted, logged)."""
        old = session.compaction
        session.compaction = new
        self.summaries.settled(session.key, new.cut_key)
        if fallback:
            self.metrics.compaction_fallbacks.labels(fallback).inc()
        before_elided = old.elided.keys() if old is not None else set()
        elided = len(new.elided.keys() - before_elided)
        log.info(
            "compaction %s: event %d of the session, about %d -> %d prompt tokens, "
            "%d tool results elided",
            kind,
            new.events,
            before,
            after,
            elided,
        )
        self.metrics.compactions.labels(kind).inc()
        self.metrics.compaction_tokens_removed.inc(max(before - after, 0))
        self.metrics.compacted_prompt_tokens.observe(after)


def _rough_tokens(messages: list[Any]) -> int:
    return sum(len(str(m.get("content") or "")) for m in messages if isinstance(m, dict)) // 4
