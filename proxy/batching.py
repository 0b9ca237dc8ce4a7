"""Round-trip metrics: how many tool calls each agent step makes and how many steps a
user's turn takes, observed after every recorded reply."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from proxy.exchange import Exchange
from proxy.known import Known
from proxy.metrics import Metrics
from proxy.scans import CLIENT_MESSAGES, with_role
from proxy.turn import Turn

USER, ASSISTANT = frozenset({"user"}), frozenset({"assistant"})


def tool_call_count(reply: dict[str, Any] | None) -> int:
    calls = reply.get("tool_calls") if isinstance(reply, dict) else None
    return len(calls) if isinstance(calls, list) else 0


def steps_in_turn(client_messages: Sequence[Any], known: Known | None = None) -> int:
    """Model calls of the user turn that this request belongs to, this one included: the
    assistant messages after the last user message, plus one. Counted from the request
    itself rather than from a per-session counter, so a retried step, a lost session or
    several requests of one session in flight can never skew it."""
    users = with_role(client_messages, USER, known, CLIENT_MESSAGES)
    # Both scans over the whole list, each carried on from the previous request's: a
    # slice after the last user message would be a new list (copied, compared, scanned).
    assistants = with_role(client_messages, ASSISTANT, known, CLIENT_MESSAGES)
    return 1 + len(assistants) - (bisect.bisect_right(assistants, users[-1]) if users else 0)


class RoundTrips:
    """A ReplyListener (proxy.tracker). A reply with tool calls is a step: its call count
    goes to ``tool_calls_per_step``. A reply without any ends the user's turn: the turn's
    model calls go to ``steps_per_user_turn``. Sessions off, no replies are recorded, so
    nothing is observed."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def after_reply(self, turn: Turn, exchange: Exchange) -> None:
        calls = tool_call_count(exchange.reply)
        if calls:
            self._metrics.tool_calls_per_step.observe(calls)
        else:
            steps = steps_in_turn(turn.client_messages, turn.known)
            self._metrics.steps_per_user_turn.observe(steps)
