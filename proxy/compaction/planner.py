"""What to compact and when, without I/O: the compacted view of a request, its token
estimate, the next event's state (elide, summary, fallback) and what a summary should
cover. proxy.compaction.compactor drives it: it fetches the context limit, runs and waits
for summaries, and commits the events."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from proxy.compaction import plan
from proxy.compaction.budget import Budget, Sizer
from proxy.compaction.state import Compaction, View, find_cut
from proxy.compaction.state import view as compacted_view
from proxy.compaction.summarizer import (
    in_context_request,
    key_facts,
    summary_message,
    summary_request,
)
from proxy.config import Settings


@dataclasses.dataclass
class Snapshot:
    """One request's messages (one per client message), their keys and token sizes."""

    messages: list[Any]
    keys: list[bytes]
    sizes: list[int]
    head: int
    tools_tokens: int


@dataclasses.dataclass(frozen=True)
class Summary:
    """A finished summary of the messages up to ``cut_index`` (exclusive)."""

    text: str
    facts: list[str]
    cut_key: bytes
    cut_index: int


@dataclasses.dataclass(frozen=True)
class SummaryAsk:
    """What to ask for the next summary, and what it will cover."""

    request: dict[str, Any]
    cut_key: bytes
    cut_index: int
    facts: list[str]


class Planner:
    def __init__(self, settings: Settings, sizer: Sizer, *, in_context: bool) -> None:
        self.settings = settings
        self.sizer = sizer
        # The upstream summarizes the conversation as it has it cached; another engine gets
        # a transcript (proxy.compaction.summarizer).
        self.in_context = in_context

    def transition(
        self,
        state: Compaction,
        snap: Snapshot,
        budget: Budget,
        cut: int,
        ready: Summary | None,
    ) -> tuple[Compaction, str, str]:
        """(new state, event kind, fallback reason) for a request past the high watermark."""
        new = state.copy()
        new.events += 1
        new.unreported = ""
        floor = max(cut, snap.head)
        window = plan.window_start(
            snap.sizes, snap.messages, floor, self.window(budget, snap, state)
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
        if elided_some and self.fits(new, snap, cut, budget.soft):
            return new, "elide", ""
        kind, fallback = "elide" if elided_some else "", ""
        if ready is not None:
            new.cut_key, new.cut_hint = ready.cut_key, ready.cut_index - 1
            new.summary = ready.text
            new.facts = ready.facts
            new.stand_in = summary_message(new.summary, new.facts)
            cut, kind = ready.cut_index, "summary"
            kept = set(snap.keys[cut:])  # elisions inside the summarized part are gone
            new.elided = {key: value for key, value in new.elided.items() if key in kept}
            if self.fits(new, snap, cut, budget.high):
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

    def settle(
        self, new: Compaction, snap: Snapshot, budget: Budget
    ) -> tuple[Compaction, View, int]:
        """The event's final state, its view and that view's estimate. When the newest turn
        leaves no room under the high watermark for the summary and its facts, the shortest
        stand-in goes instead (the running summary's text stays for the next event)."""
        cut = find_cut(new, snap.keys) or 0
        compacted = self.view(new, snap, cut)
        after = self.estimate(compacted, snap, new)
        # Shorter and shorter stand-ins: the marker alone, then nothing at all (the head and
        # the newest turn only, when just that fits the engine).
        for stand_in, room in ((plan.marker(), budget.high), (None, budget.limit)):
            if after <= room or new.stand_in is None:
                break
            bare = new.copy()
            bare.stand_in = stand_in
            shortest = self.view(bare, snap, cut)
            if (estimate := self.estimate(shortest, snap, bare)) < after:
                new, compacted, after = bare, shortest, estimate
        return new, compacted, after

    def window(self, budget: Budget, snap: Snapshot, state: Compaction) -> int:
        """Tokens (estimate) of the verbatim window: ``compaction_window`` of the limit, or
        less when a long pinned head would leave a compacted prompt above the soft
        watermark, with no room to grow before the next event."""
        fixed = sum(snap.sizes[: snap.head]) + snap.tools_tokens + self.settings.summary_max_tokens
        room = int(budget.soft / state.ratio) - fixed
        return max(min(int(budget.window / state.ratio), room), 0)

    def fits(self, state: Compaction, snap: Snapshot, cut: int, limit: int) -> bool:
        return self.estimate(self.view(state, snap, cut), snap, state) <= limit

    def snapshot(
        self, messages: list[Any], keys: Sequence[bytes], state: Compaction, tools: Any
    ) -> Snapshot:
        sizes = self.sizer.messages(messages, keys, state.sizes)
        return Snapshot(
            messages, list(keys), sizes, plan.head_length(messages), self.sizer.tools(tools)
        )

    def view(self, state: Compaction, snap: Snapshot, cut: int) -> View:
        stand_in = self.sizer.message(state.stand_in) if state.stand_in else 0
        return compacted_view(state, snap.messages, snap.keys, snap.sizes, snap.head, cut, stand_in)

    def estimate(self, current: View, snap: Snapshot, state: Compaction) -> int:
        return int((sum(current.sizes) + snap.tools_tokens) * state.ratio)

    def summary_ask(
        self,
        state: Compaction,
        snap: Snapshot,
        budget: Budget,
        cut: int,
        request: dict[str, Any],
    ) -> SummaryAsk | None:
        """The summary of the turns between the pinned head (or the last cut) and the
        window; None when there is nothing to fold."""
        floor = max(cut, snap.head)
        end = plan.window_start(snap.sizes, snap.messages, floor, self.window(budget, snap, state))
        if end <= floor:
            return None
        folded = snap.messages[floor:end]
        model = self.settings.summarizer_model or str(request.get("model") or "")
        cap = self.settings.summary_max_tokens
        if self.in_context:
            current = self.view(state, snap, cut)
            prefix = current.messages[: len(current.messages) - (len(snap.messages) - end)]
            ask = in_context_request({**request, "model": model}, prefix, cap)
        else:
            ask = summary_request(model, state.summary, folded, cap)
        facts = key_facts(folded, previous=state.facts)
        return SummaryAsk(ask, snap.keys[end - 1], end, facts)
