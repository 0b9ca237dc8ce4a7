"""Sessions around a chat request: find the session, judge the prompt's continuity, and
record the reply afterwards. The tracker is the one owner of session records: it loads a
record when a request opens its session and saves it when the reply is recorded;
background work (warm-ups, summaries) posts its results here, and they are written to the
stored record the same way (load, change, compare and set), so every replica sharing the
store sees them. Failing open: a store error costs the session, not the request."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from proxy import prefix
from proxy.exchange import Exchange, token_counts
from proxy.failopen import FailOpenLog
from proxy.jsonio import InvalidJSON
from proxy.metrics import Metrics
from proxy.rewrite import learned
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
    # Lines of the system prompt learned volatile by this request (proxy.rewrite.learned).
    learned: int = 0
    learned_moved: int = 0  # lines moved because they were learned
    recorded: bool = False


class ReplyListener(Protocol):
    """Work that follows a recorded reply (warm-up, summaries, round-trip metrics). Called
    on the request's task: it must return at once and start anything slow as a task."""

    def after_reply(self, turn: Turn, exchange: Exchange) -> None: ...


# A change to a session record, posted by background work (idempotent: it may be applied
# to more than one load of the record before a save keeps it).
Change = Callable[[Session], None]


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
        # Told the key of each session a request opens (a warm-up for it is then late).
        self.on_open: list[Callable[[str], None]] = []
        self._failures = FailOpenLog(log)
        self._applying: set[asyncio.Task[bool]] = set()
        metrics.sessions_active.set_function(lambda: store.held() or 0)

    def post(self, key: str, change: Change) -> None:
        """Background work's result for session ``key``, written to the stored record by
        a task of its own (load, change, compare and set; again on a conflict)."""
        task = asyncio.get_running_loop().create_task(self.apply(key, change))
        self._applying.add(task)
        task.add_done_callback(self._applying.discard)

    async def apply(self, key: str, change: Change, attempts: int = 3) -> bool:
        """``change`` into the stored record of ``key``; False if there is none, the store
        failed or every attempt lost its race."""
        try:
            for _ in range(attempts):
                session = await self.store.get(key)
                if session is None:
                    return False
                change(session)
                if await self.store.save(session):
                    return True
                self._metrics.session_conflicts.inc()
        except Exception as exc:  # fail open: a follow-up result is not worth a request
            self._failures.failed("session update", exc)
            self._metrics.session_errors.inc()
        return False

    async def settled(self) -> None:
        """Wait for the posted results in flight (tests, shutdown)."""
        while self._applying:
            await asyncio.gather(*self._applying, return_exceptions=True)

    async def aclose(self) -> None:
        await self.settled()
        await self.store.aclose()

    async def open(self, headers: Mapping[str, str], request: dict[str, Any]) -> Turn | None:
        messages = request.get("messages")
        if not isinstance(messages, list):
            return None
        try:
            keys = chain_keys(messages, self.detector.key)
        except InvalidJSON as exc:  # fail open: a body too odd to key goes on as sent
            self._failures.failed("session keys", exc)
            return None
        try:
            key, _source = identify(headers, request, self.detector.key)
            session = await self.store.get(key)
        except Exception as exc:  # fail open: the request goes on without its session
            self._failures.failed("session lookup", exc)
            self._metrics.session_errors.inc()
            return None
        self._metrics.sessions_loaded.labels("new" if session is None else "found").inc()
        session = session or Session(key)
        for opened in self.on_open:
            opened(key)
        try:
            new, moved = self._learn(session, messages)
        except Exception as exc:  # fail open: nothing learned this time
            self._failures.failed("volatile learning", exc)
            new = moved = 0
        turn = Turn(session, messages, keys)
        turn.learned, turn.learned_moved = new, moved
        if new:
            self._metrics.volatile_lines_learned.inc(new)
        turn.follows_tool_calls = session.last_reply_tool_calls > 0
        turn.warmed = session.warmed
        return turn

    def _learn(self, session: Session, messages: list[Any]) -> tuple[int, int]:
        """What changed in the system prompt since the session's previous request
        (proxy.rewrite.learned): (lines learned volatile by this request, lines of it
        move_volatile moves because they were learned)."""
        lines = learned.system_lines(messages)
        digest = hashlib.blake2b("\n".join(lines).encode(), digest_size=16).digest()
        new = 0
        if digest == session.system_digest:  # unchanged: only the counts move on
            previous = session.system_lines
            session.learned, _ = learned.learn(previous, previous, session.learned)
        else:
            mask = self.detector.mask
            signatures = tuple(learned.signature(line, mask) for line in lines)
            if session.system_lines:
                session.learned, new = learned.learn(
                    session.system_lines, signatures, session.learned
                )
            session.system_digest, session.system_lines = digest, signatures
        test = learned.learned_line(session.learned, self.detector.mask)
        moved = sum(1 for line in lines if test(line)) if test is not None else 0
        return new, moved

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
        except Exception as exc:  # fail open: a metric is not worth a request
            self._failures.failed("prefix continuity", exc)
            self._metrics.session_errors.inc()
            return
        exchange.prefix_break = continuity.reason
        if turn.learned and continuity.reason == "system_changed":
            exchange.prefix_break = "volatile_learned"  # its lines move from now on
        exchange.expected_cached = continuity.expected_cached
        exchange.learned_lines = turn.learned_moved

    def _note_placed(self, turn: Turn, session: Session) -> None:
        """Which message carries the current volatile-lines note (see move_volatile)."""
        # The lines this request's note carried: learned by the turn's own record.
        lines = volatile_lines(turn.client_messages, self.detector, turn.session)
        target = note_target(turn.client_messages)
        if lines != session.last_note_lines and target is not None:
            session.last_note_lines = lines
            session.note_carrier = turn.keys[target]

    async def close(self, turn: Turn, exchange: Exchange) -> None:
        """After the reply: remember it (only a complete, successful one; once), let the
        listeners follow up, and save the record."""
        if turn.recorded or exchange.status != 200 or exchange.reply is None:
            return
        turn.recorded = True
        try:
            self._remember(turn, turn.session, exchange)
        except Exception as exc:  # fail open
            self._failures.failed("session update", exc)
            self._metrics.session_errors.inc()
            return
        for listener in self.listeners:
            try:
                listener.after_reply(turn, exchange)
            except Exception as exc:  # fail open: follow-up work never costs the reply
                name = type(listener).__name__
                self._failures.failed(f"{name} after a reply", exc)
                self._metrics.listener_failures.labels(name).inc()
        await self._save(turn, exchange)

    def _remember(self, turn: Turn, session: Session, exchange: Exchange) -> None:
        """The reply into ``session`` (the turn's, or a fresher load of the same record)."""
        assert exchange.reply is not None
        # An upstream that reports no usage still gets its history restored.
        counts = token_counts(exchange.usage) or (0, 0, 0)
        prefix.remember(
            session,
            turn.client_messages,
            turn.forwarded_messages,
            turn.tools,
            exchange.reply,
            prompt_tokens=counts[0],
            completion_tokens=counts[2],
            mask=self.detector.key,
            keys=turn.keys,
            rewritten=turn.rewritten_messages,
        )
        calls = exchange.reply.get("tool_calls")
        session.last_reply_tool_calls = len(calls) if isinstance(calls, list) else 0
        session.warmed = False
        # The first values seen stay pinned for the session (setdefault: first wins).
        for key, value in pinnable(turn.template_kwargs, self.detector).items():
            session.pinned_template_kwargs.setdefault(key, value)
        self._note_placed(turn, session)

    async def _save(self, turn: Turn, exchange: Exchange) -> None:
        """Compare and set. When another request of the session saved first (a retry, two
        sub-agents sharing a head, a background result), its record is loaded again and
        this reply recorded into it: both replies' substitutions survive; this one's
        follow-up state (compaction, pacing) gives way to the other's, which is as recent."""
        key = turn.session.key
        try:
            if await self.store.save(turn.session):
                self._metrics.sessions_saved.inc()
                return
            self._metrics.session_conflicts.inc()
            fresh = await self.store.get(key) or Session(key)
            if fresh.last_chain == turn.session.last_chain:
                return  # the other save recorded this same conversation and reply (a retry)
            self._remember(turn, fresh, exchange)
            if await self.store.save(fresh):
                self._metrics.sessions_saved.inc()
            else:
                log.warning("session %s changed twice during one save; reply not kept", key)
        except Exception as exc:  # fail open
            self._failures.failed("session save", exc)
            self._metrics.session_errors.inc()
