"""Sessions around a chat request: find the session, judge the prompt's continuity, and
record the reply afterwards. Failing open: a store error costs the session, not the request."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from proxy import prefix
from proxy.exchange import Exchange, token_counts
from proxy.metrics import Metrics
from proxy.rewrite.template_kwargs import pinnable
from proxy.rewrite.volatile import VolatileDetector, note_target, volatile_lines
from proxy.sessions import Session, SessionStore, identify
from proxy.transcript import chain_keys

log = logging.getLogger("prefill_proxy.sessions")


@dataclasses.dataclass
class Turn:
    """One request of a session, from lookup to recorded reply."""

    session: Session
    client_messages: list[Any]
    keys: list[bytes]  # chain keys of the client's messages
    forwarded_messages: list[Any] = dataclasses.field(default_factory=list)
    # The pipeline's messages, one per client message (compaction may shorten the above).
    rewritten_messages: list[Any] | None = None
    # The whole request as it went upstream, and the client's credentials for follow-up
    # requests on its behalf (warm-up, summary): held in memory by this request and the
    # follow-up tasks it starts, never put in the session store or logged.
    request: dict[str, Any] = dataclasses.field(default_factory=dict)
    credentials: tuple[tuple[bytes, bytes], ...] = ()
    tools: Any = None
    template_kwargs: Any = None
    # The session's previous reply asked for tools (this request carries their results),
    # and whether the proxy warmed the engine for this step.
    follows_tool_calls: bool = False
    warmed: bool = False
    recorded: bool = False


class ReplyListener(Protocol):
    """Work that follows a recorded reply (warm-up, summaries, round-trip metrics). Called
    on the request's task: it must return at once and start anything slow as a task."""

    def after_reply(self, turn: Turn, exchange: Exchange) -> None: ...


class SessionTracker:
    def __init__(
        self,
        store: SessionStore,
        detector: VolatileDetector,
        metrics: Metrics,
        listeners: Sequence[ReplyListener] = (),
    ) -> None:
        self.store = store
        self.detector = detector
        self._metrics = metrics
        self.listeners = list(listeners)
        metrics.sessions_active.set_function(lambda: len(store))

    def open(self, headers: Mapping[str, str], request: dict[str, Any]) -> Turn | None:
        messages = request.get("messages")
        if not isinstance(messages, list):
            return None
        try:
            key, _source = identify(headers, request, self.detector.mask)
            session = self.store.get(key) or Session(key)
        except Exception:  # fail open: the request goes on without its session
            log.exception("session lookup failed")
            self._metrics.session_errors.inc()
            return None
        turn = Turn(session, messages, chain_keys(messages, self.detector.mask))
        turn.follows_tool_calls = session.last_reply_tool_calls > 0
        turn.warmed = session.warmed
        return turn

    def forward(
        self,
        turn: Turn,
        forwarded: dict[str, Any],
        exchange: Exchange,
        rewritten_messages: list[Any] | None = None,
    ) -> None:
        """The request as it goes upstream: how it continues the session's last one.
        ``rewritten_messages``: the pipeline's messages, when compaction changed them after."""
        messages = forwarded.get("messages")
        turn.request = forwarded
        turn.forwarded_messages = messages if isinstance(messages, list) else []
        turn.rewritten_messages = rewritten_messages
        turn.tools = forwarded.get("tools")
        turn.template_kwargs = forwarded.get("chat_template_kwargs")
        if exchange.compaction:
            exchange.prefix_break = "compaction"
            exchange.expected_cached = 0
            return
        try:
            continuity = prefix.classify(turn.session, turn.forwarded_messages, turn.tools)
        except Exception:  # fail open: a metric is not worth a request
            log.exception("prefix continuity failed")
            self._metrics.session_errors.inc()
            return
        exchange.prefix_break = continuity.reason
        exchange.expected_cached = continuity.expected_cached

    def _note_placed(self, turn: Turn) -> None:
        """Which message carries the current volatile-lines note (see move_volatile)."""
        lines = volatile_lines(turn.client_messages, self.detector)
        target = note_target(turn.client_messages)
        if lines != turn.session.last_note_lines and target is not None:
            turn.session.last_note_lines = lines
            turn.session.note_carrier = turn.keys[target]

    def close(self, turn: Turn, exchange: Exchange) -> None:
        """After the reply: remember it (only a complete, successful one; once)."""
        if turn.recorded or exchange.status != 200 or exchange.reply is None:
            return
        # An upstream that reports no usage still gets its history restored.
        counts = token_counts(exchange.usage) or (0, 0, 0)
        turn.recorded = True
        try:
            prefix.remember(
                turn.session,
                turn.client_messages,
                turn.forwarded_messages,
                turn.tools,
                exchange.reply,
                prompt_tokens=counts[0],
                completion_tokens=counts[2],
                mask=self.detector.mask,
                keys=turn.keys,
                rewritten=turn.rewritten_messages,
            )
            calls = exchange.reply.get("tool_calls")
            turn.session.last_reply_tool_calls = len(calls) if isinstance(calls, list) else 0
            turn.session.warmed = False
            # The first values seen stay pinned for the session (setdefault: first wins).
            for key, value in pinnable(turn.template_kwargs, self.detector).items():
                turn.session.pinned_template_kwargs.setdefault(key, value)
            self._note_placed(turn)
            self.store.put(turn.session)
        except Exception:  # fail open
            log.exception("session update failed")
            self._metrics.session_errors.inc()
            return
        for listener in self.listeners:
            try:
                listener.after_reply(turn, exchange)
            except Exception:  # fail open: follow-up work never costs the reply
                name = type(listener).__name__
                log.exception("%s failed after a reply", name)
                self._metrics.listener_failures.labels(name).inc()
