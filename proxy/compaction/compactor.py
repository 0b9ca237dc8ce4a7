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

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any, Protocol

from proxy import tokens
from proxy.compaction import plan
from proxy.compaction.budget import Budget, ContextLimits, Sizer
from proxy.compaction.state import Compaction, View, find_cut, view
from proxy.compaction.summaries import Pending, Summaries
from proxy.compaction.summarizer import (
    in_context_request,
    key_facts,
    summary_message,
    summary_request,
)
from proxy.config import Settings
from proxy.exchange import Exchange, token_counts
from proxy.metrics import Metrics
from proxy.transcript import Mask, next_key
from proxy.upstream import RawHeaders, Upstream

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
    ) -> None: ...


@dataclasses.dataclass
class Snapshot:
    """One request's messages (one per client message), their keys and token sizes."""

    messages: list[Any]
    keys: list[bytes]
    sizes: list[int]
    head: int
    tools_tokens: int


class Compactor:
    def __init__(
        self,
        settings: Settings,
        upstream: Upstream,
        metrics: Metrics,
        *,
        summarizer: Upstream | None = None,
        mask: Mask | None = None,
        warmer: Warmer | None = None,
    ) -> None:
        self.settings = settings
        self.limits = ContextLimits(settings, upstream)
        # The upstream summarizes the conversation as it has it cached; another engine gets
        # a transcript (proxy.compaction.summarizer).
        self.in_context = summarizer is None
        self.summaries = Summaries(settings, summarizer or upstream, metrics)
        self.metrics = metrics
        self.mask = mask
        self.warmer = warmer
        self._sizer: Sizer | None = None  # tiktoken is provisioned at start-up, not here

    @property
    def sizer(self) -> Sizer:
        if self._sizer is None:
            self._sizer = Sizer(tokens.counter())
        return self._sizer

    def close(self) -> None:
        """Cancel the summaries still being written (at shutdown)."""
        self.summaries.close()

    # -- per request ---------------------------------------------------------------------

    async def apply(self, request: dict[str, Any], turn: Any, exchange: Exchange) -> dict[str, Any]:
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
        budget = Budget.of(limit, self.settings)
        session = turn.session
        state = session.compaction
        if not isinstance(state, Compaction):
            state = session.compaction = Compaction()
        snap = self._snapshot(messages, turn.keys, state, request.get("tools"))
        cut = find_cut(state, snap.keys)
        if cut is None:  # the client changed the folded part: what was folded is gone
            state = session.compaction = Compaction(sizes=state.sizes, ratio=state.ratio)
            self.summaries.drop(session.key)
            cut = 0
        current = self._view(state, snap, cut)
        estimate = self._estimate(current, snap, state)
        if estimate > budget.high:
            ready, reason = await self._summary_for(state, snap, budget, cut, turn, request)
            new, kind, fallback = self._transition(state, snap, budget, cut, ready)
            if not kind:  # nothing left to compact
                if estimate > budget.limit:
                    self.metrics.compaction_fallbacks.labels("too_long").inc()
                return request if estimate > budget.limit else self._with(request, current)
            new, compacted, after = self._settle(new, snap, budget)
            if after > budget.limit:  # even head + newest turn: let the engine say so
                self.metrics.compaction_fallbacks.labels("too_long").inc()
                return request
            if after >= estimate:  # nothing gained: keep the prefix the engine has cached
                return self._with(request, current)
            fallback = fallback or (reason if kind == "fallback" else "")
            self._commit(session, new, kind, fallback, estimate, after)
            exchange.compaction = kind
            state, current = new, compacted
        else:
            if state.unreported:  # decided after the last reply: this request carries it
                exchange.compaction, state.unreported = state.unreported, ""
            if estimate > budget.soft:
                self._start_summary(state, snap, budget, cut, turn, request)
        state.last_estimate = sum(current.sizes) + snap.tools_tokens
        return self._with(request, current)

    @staticmethod
    def _with(request: dict[str, Any], current: View) -> dict[str, Any]:
        if current.messages == request["messages"]:
            return request
        return {**request, "messages": current.messages}

    # -- after a reply -------------------------------------------------------------------

    def after_reply(self, turn: Any, exchange: Exchange) -> None:
        state = turn.session.compaction
        if not isinstance(state, Compaction):
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
        self, state: Compaction, turn: Any, exchange: Exchange, predicted: int
    ) -> None:
        """If the next request will cross the high watermark and its summary is ready,
        make the event now and warm its prompt: the client is busy with its tools."""
        limit = self.limits.known(str(turn.request.get("model") or ""))
        pending = self.summaries.get(turn.session.key)
        if limit is None or pending is None or not pending.succeeded:
            return
        budget = Budget.of(limit, self.settings)
        if predicted <= budget.high:
            return
        aligned = turn.rewritten_messages or turn.forwarded_messages
        if len(aligned) != len(turn.keys) or not turn.keys:
            return
        reply = exchange.reply
        messages = [*aligned, reply]
        keys = [*turn.keys, next_key(turn.keys[-1], reply, self.mask)]
        snap = self._snapshot(messages, keys, state, turn.request.get("tools"))
        cut = find_cut(state, keys)
        if cut is None or pending.base != state.cut_key:
            return
        new, kind, fallback = self._transition(state, snap, budget, cut, pending)
        if kind in ("", "fallback") or fallback:
            return  # the request itself decides, with its summary_wait
        before = self._estimate(self._view(state, snap, cut), snap, state)
        new, compacted, after = self._settle(new, snap, budget)
        if after >= before:
            return
        new.unreported = kind
        if kind == "summary":  # ready before it was needed
            self.metrics.summaries.labels("on_time").inc()
        self._commit(turn.session, new, kind, "", before, after)
        warm = {**turn.request, "messages": compacted.messages}
        self.warmer.warm(warm, turn.credentials, turn.session.key, "compaction")  # type: ignore[union-attr]

    # -- decisions -----------------------------------------------------------------------

    def _transition(
        self,
        state: Compaction,
        snap: Snapshot,
        budget: Budget,
        cut: int,
        ready: Pending | None,
    ) -> tuple[Compaction, str, str]:
        """(new state, event kind, fallback reason) for a request past the high watermark."""
        new = state.copy()
        new.events += 1
        new.unreported = ""
        floor = max(cut, snap.head)
        window = plan.window_start(
            snap.sizes, snap.messages, floor, self._window(budget, snap, state)
        )
        for index in plan.elision_candidates(
            snap.messages,
            snap.sizes,
            floor,
            window,
            min_tokens=self.settings.elide_min_tokens,
            after_steps=self.settings.elide_after_steps,
        ):
            key = snap.keys[index]
            if key not in new.elided:
                name = plan.tool_name(snap.messages, index)
                stand_in = plan.elided(snap.messages[index], name, snap.sizes[index])
                new.elided[key] = (stand_in, self.sizer.message(stand_in))
        elided_some = len(new.elided) > len(state.elided)
        if elided_some and self._fits(new, snap, cut, budget.soft):
            return new, "elide", ""
        kind, fallback = "elide" if elided_some else "", ""
        if ready is not None:
            new.cut_key, new.cut_hint = ready.cut_key, ready.cut_index - 1
            new.summary = ready.task.result()
            new.facts = ready.facts
            new.stand_in = summary_message(new.summary, new.facts)
            cut, kind = ready.cut_index, "summary"
            kept = set(snap.keys[cut:])  # elisions inside the summarized part are gone
            new.elided = {key: value for key, value in new.elided.items() if key in kept}
            if self._fits(new, snap, cut, budget.high):
                return new, kind, ""
            fallback = "still_over"
        # Drop the oldest turns (after any summary) until the prompt is under the soft mark.
        floor = max(cut, snap.head)
        target = int(budget.soft / new.ratio)
        summary, facts = new.summary, new.facts
        stand_in_tokens = (self.sizer.message(new.stand_in) if new.stand_in else 0) + 96
        drop_to = floor
        for _ in range(3):  # the stand-in grows with what it replaces: settle its size
            fixed = sum(snap.sizes[: snap.head]) + stand_in_tokens + snap.tools_tokens
            drop_to = plan.cut_to_fit(snap.sizes, snap.messages, floor, fixed, target)
            if drop_to <= floor:  # nothing left to drop: the newest turn is all there is
                return new, kind, fallback
            new.facts = key_facts(snap.messages[floor:drop_to], previous=facts)
            text = plan.marker(drop_to - floor)["content"]
            new.summary = f"{summary}\n\n{text}" if summary else None
            if new.summary:
                new.stand_in = summary_message(new.summary, new.facts)
            else:
                new.stand_in = summary_message(text, new.facts, header=False)
            actual = self.sizer.message(new.stand_in)
            if actual <= stand_in_tokens:
                break
            stand_in_tokens = actual
        new.cut_key, new.cut_hint = snap.keys[drop_to - 1], drop_to - 1
        kept = set(snap.keys[drop_to:])
        new.elided = {key: value for key, value in new.elided.items() if key in kept}
        return new, "fallback", fallback

    def _settle(
        self, new: Compaction, snap: Snapshot, budget: Budget
    ) -> tuple[Compaction, View, int]:
        """The event's final state, its view and that view's estimate. When the newest turn
        leaves no room under the high watermark for the summary and its facts, the shortest
        stand-in goes instead (the running summary's text stays for the next event)."""
        cut = find_cut(new, snap.keys) or 0
        compacted = self._view(new, snap, cut)
        after = self._estimate(compacted, snap, new)
        # Shorter and shorter stand-ins: the marker alone, then nothing at all (the head and
        # the newest turn only, when just that fits the engine).
        for stand_in, room in ((plan.marker(), budget.high), (None, budget.limit)):
            if after <= room or new.stand_in is None:
                break
            bare = new.copy()
            bare.stand_in = stand_in
            shortest = self._view(bare, snap, cut)
            if (estimate := self._estimate(shortest, snap, bare)) < after:
                new, compacted, after = bare, shortest, estimate
        return new, compacted, after

    def _window(self, budget: Budget, snap: Snapshot, state: Compaction) -> int:
        """Tokens (estimate) of the verbatim window: ``compaction_window`` of the limit, or
        less when a long pinned head would leave a compacted prompt above the soft
        watermark, with no room to grow before the next event."""
        fixed = sum(snap.sizes[: snap.head]) + snap.tools_tokens + self.settings.summary_max_tokens
        room = int(budget.soft / state.ratio) - fixed
        return max(min(int(budget.window / state.ratio), room), 0)

    def _fits(self, state: Compaction, snap: Snapshot, cut: int, limit: int) -> bool:
        return self._estimate(self._view(state, snap, cut), snap, state) <= limit

    # -- summaries -----------------------------------------------------------------------

    async def _summary_for(
        self,
        state: Compaction,
        snap: Snapshot,
        budget: Budget,
        cut: int,
        turn: Any,
        request: dict[str, Any],
    ) -> tuple[Pending | None, str]:
        """The summary for an event now: (ready summary or None, fallback reason)."""
        key = turn.session.key
        pending = self._start_summary(state, snap, budget, cut, turn, request)
        if pending is None:
            return None, "summary_failed"
        outcome = await self.summaries.wait(key, pending)
        if outcome in ("on_time", "late"):
            return pending, ""
        return None, "summary_late" if outcome == "missing" else "summary_failed"

    def _start_summary(
        self,
        state: Compaction,
        snap: Snapshot,
        budget: Budget,
        cut: int,
        turn: Any,
        request: dict[str, Any],
    ) -> Pending | None:
        """The session's summary of the turns before the window: the one being written,
        or a new one."""
        key = turn.session.key
        pending = self.summaries.valid(key, state.cut_key, snap.keys)
        if pending is not None or not self.summaries.may_start(key):
            return pending
        floor = max(cut, snap.head)
        end = plan.window_start(snap.sizes, snap.messages, floor, self._window(budget, snap, state))
        if end <= floor:
            return None
        folded = snap.messages[floor:end]
        model = self.settings.summarizer_model or str(request.get("model") or "")
        cap = self.settings.summary_max_tokens
        if self.in_context:
            current = self._view(state, snap, cut)
            prefix = current.messages[: len(current.messages) - (len(snap.messages) - end)]
            ask = in_context_request({**request, "model": model}, prefix, cap)
        else:
            ask = summary_request(model, state.summary, folded, cap)
        return self.summaries.start(
            key,
            ask,
            turn.credentials,
            base=state.cut_key,
            cut_key=snap.keys[end - 1],
            cut_index=end,
            facts=key_facts(folded, previous=state.facts),
        )

    # -- bookkeeping ---------------------------------------------------------------------

    def _snapshot(
        self, messages: list[Any], keys: Sequence[bytes], state: Compaction, tools: Any
    ) -> Snapshot:
        sizes = self.sizer.messages(messages, keys, state.sizes)
        return Snapshot(
            messages, list(keys), sizes, plan.head_length(messages), self.sizer.tools(tools)
        )

    def _view(self, state: Compaction, snap: Snapshot, cut: int) -> View:
        stand_in = self.sizer.message(state.stand_in) if state.stand_in else 0
        return view(state, snap.messages, snap.keys, snap.sizes, snap.head, cut, stand_in)

    def _estimate(self, current: View, snap: Snapshot, state: Compaction) -> int:
        return int((sum(current.sizes) + snap.tools_tokens) * state.ratio)

    def _commit(
        self, session: Any, new: Compaction, kind: str, fallback: str, before: int, after: int
    ) -> None:
        """Make ``new`` the session's compaction: an event of ``kind`` (counted, logged)."""
        old = session.compaction
        session.compaction = new
        self.summaries.settled(session.key, new.cut_key)
        if fallback:
            self.metrics.compaction_fallbacks.labels(fallback).inc()
        before_elided = old.elided.keys() if isinstance(old, Compaction) else set()
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
