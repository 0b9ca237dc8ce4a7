"""Sessions around a chat request: find the session, judge the prompt's continuity, and
record the reply afterwards. The tracker is the one owner of session records: it loads a
record when a request opens its session and saves it when the reply is recorded;
background work (warm-ups, summaries) posts its results here, and they are written to the
stored record the same way (load, change, compare and set), so every replica sharing the
store sees them. Failing open: a store error costs the session, not the request."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from proxy import prefix, record
from proxy.exchange import Exchange, token_counts
from proxy.failopen import FailOpenLog
from proxy.history import head_key, history_keys, leading_system
from proxy.jsonio import InvalidJSON
from proxy.known import Known
from proxy.metrics import Metrics
from proxy.rewrite import learned, restore
from proxy.rewrite.detector import VolatileDetector
from proxy.rewrite.template_kwargs import pinnable
from proxy.rewrite.volatile import notes_after
from proxy.sessions import MAX_SUBSTITUTIONS, Session, SessionStore, fingerprint, identify
from proxy.transcript import Memo, Memos, chain_keys
from proxy.turn import Turn

log = logging.getLogger("prefill_proxy.sessions")

# Alias records' keys (session keys start h:, u:, p:, c: for a conversation id, f:, and
# q: for a chain whose first response this proxy did not see).
ALIAS_PREFIX = "a:"
RESPONSE_PREFIX = "r:"  # a Responses API response id -> the session it answered
FAMILY_PREFIX = "l:"  # family records: line shapes learned by conversations sharing a prompt


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
        memo_limit: int = 1 << 17,
    ) -> None:
        self.store = store
        self.detector = detector
        self._metrics = metrics
        self.listeners = list(listeners)
        # Told the key of each session a request opens (a warm-up for it is then late).
        self.on_open: list[Callable[[str], None]] = []
        self._failures = FailOpenLog(log)
        self._applying: set[asyncio.Task[bool]] = set()
        self._memos = Memos(memo_limit)
        metrics.sessions_active.set_function(lambda: store.held() or 0)

    def post(self, key: str, change: Change, *, create: bool = False) -> None:
        """Background work's result for session ``key``, written to the stored record by
        a task of its own (load, change, compare and set; again on a conflict).
        ``create``: into a new record if there is none."""
        task = asyncio.get_running_loop().create_task(self.apply(key, change, create=create))
        self._applying.add(task)
        task.add_done_callback(self._applying.discard)

    async def apply(
        self, key: str, change: Change, attempts: int = 3, *, create: bool = False
    ) -> bool:
        """``change`` into the stored record of ``key``; False if there is none (unless
        ``create``), the store failed or every attempt lost its race."""
        try:
            for _ in range(attempts):
                session = await self.store.get(key)
                if session is None and create:
                    session = Session(key)
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

    async def open(
        self,
        headers: Mapping[str, str],
        request: dict[str, Any],
        *,
        conversation: str = "",
        chained_to: str = "",
        known: Known | None = None,
    ) -> Turn | None:
        """The request's session. A Responses request may also name it by its
        ``conversation`` or continue a response (``chained_to``: previous_response_id).
        ``known``: what is known already of the request's parsed messages (proxy.bodies),
        filled in with the rest."""
        messages = request.get("messages")
        if not isinstance(messages, list):
            return None
        try:
            key, source = identify(headers, request, self.detector.key, conversation, known)
            if source == "fingerprint" and chained_to:  # the session that answered it
                pointer = await self.store.get(RESPONSE_PREFIX + chained_to)
                key = pointer.alias_of if pointer and pointer.alias_of else "q:" + chained_to
                source = "previous_response_id"
            session = await self.store.get(key)
            outcome, alias = ("new" if session is None else "found"), ""
            if session is None and source == "fingerprint":
                alias = ALIAS_PREFIX + fingerprint(request, self.detector.key, with_system=False)
                session = await self._continued(alias, messages)
                if session is not None:
                    outcome, alias = "continued", ""
        except InvalidJSON as exc:  # fail open: a body too odd to key goes on as sent
            self._failures.failed("session keys", exc)
            return None
        except Exception as exc:  # fail open: the request goes on without its session
            self._failures.failed("session lookup", exc)
            self._metrics.session_errors.inc()
            return None
        self._metrics.sessions_loaded.labels(outcome).inc()
        session = session or Session(key)
        for opened in self.on_open:
            opened(key)
        try:
            if outcome == "new":
                await self._seed(session, request)
            before = session.learned
            new, moved = self._learn(session, messages, known)
            if new:
                self._publish(before, session.learned, request)
        except Exception as exc:  # fail open: nothing learned this time
            self._failures.failed("volatile learning", exc)
            new = moved = 0
        # Keys leave learned lines out (a learned block grows without changing them).
        mask = self._mask(session.learned)
        try:
            memo = Memo(self._memos.get(session.key), known)
            keys = chain_keys(messages, mask, memo)
            lookup = history_keys(session, messages, keys, mask, memo)
        except InvalidJSON as exc:  # fail open: a body too odd to key goes on as sent
            self._failures.failed("session keys", exc)
            return None
        turn = Turn(
            session,
            messages,
            keys,
            mask=mask,
            alias=alias,
            lookup_keys=lookup,
            memo=memo,
            known=known,
        )
        turn.learned, turn.learned_moved = new, moved
        if new:
            self._metrics.volatile_lines_learned.inc(new)
        turn.follows_tool_calls = session.last_reply_tool_calls > 0
        turn.warmed, turn.warmed_tokens = session.warmed, session.warmed_tokens
        turn.full_history = not chained_to
        return turn

    def _family(self, request: Mapping[str, Any]) -> str:
        """The record of what the conversations sharing this system prompt and tools (read
        with every number as 0) learned."""
        return FAMILY_PREFIX + fingerprint(request, self.detector.key, with_user=False)

    async def _seed(self, session: Session, request: Mapping[str, Any]) -> None:
        """A new session starts with the line shapes its family learned, so its first
        request already moves a clock an earlier conversation of the family taught: no
        miss on its second step. Each seeding is counted in the family record: a shape
        seeds ``learned.UNLEARN_AFTER`` sessions, then one that learns it again (a miss)
        renews it, so a number edited once in a shared prompt is not moved for ever."""
        family = self._family(request)
        record = await self.store.get(family)
        shapes = learned.shapes(record.learned if record else None)
        if not shapes:
            return
        session.learned = dict.fromkeys(shapes, 0)
        self.post(family, lambda family_record: learned.seeded(family_record.learned, shapes))

    def _publish(
        self, before: Mapping[bytes, int], after: Mapping[bytes, int], request: Mapping[str, Any]
    ) -> None:
        """Shapes this request learned, into its family's record (made if new)."""
        shapes = learned.shapes(after) - learned.shapes(before)
        if shapes:
            family = self._family(request)
            self.post(family, lambda record: learned.taught(record.learned, shapes), create=True)

    def _mask(self, learned_keys: Mapping[bytes, int]) -> Callable[[str], str]:
        test = learned.learned_line(learned_keys, self.detector.mask)
        return learned.keyed(self.detector.key, test)

    async def _continued(self, alias: str, messages: list[Any]) -> Session | None:
        """The session a fingerprinted request continues although its fingerprint is new
        (its system prompt changed: a line no rule knows yet, an edit): the one its alias
        (tools and first user message) points to, if that session's first exchange is
        this request's too. Two conversations never join: their first replies differ."""
        head = head_key(messages, self.detector.key)
        if head is None:
            return None  # a first request: nothing to continue
        pointer = await self.store.get(alias)
        if pointer is None or not pointer.alias_of:
            return None
        session = await self.store.get(pointer.alias_of)
        if session is None or session.head != head:
            return None
        return session

    def _learn(self, session: Session, messages: list[Any], known: Known | None) -> tuple[int, int]:
        """What changed in the system prompt since the session's previous request
        (proxy.rewrite.learned): (lines learned volatile by this request, lines of it
        move_volatile moves because they were learned)."""
        lines, digest = learned.text_lines(learned.system_texts(messages, known))
        new = 0
        if digest == session.system_digest:  # unchanged: only the counts move on
            previous = session.system_lines
            session.learned, _ = learned.learn(previous, previous, session.learned)
        else:
            signatures = learned.signatures(lines, self.detector.mask)
            if session.system_lines:
                session.learned, new = learned.learn(
                    session.system_lines,
                    signatures,
                    session.learned,
                    [learned.learnable(line) for line in lines],
                )
            session.system_digest, session.system_lines = digest, signatures
        test = learned.learned_line(session.learned, self.detector.mask)
        moved = learned.learned_count(lines, test) if test is not None else 0
        return new, moved

    def forward(
        self,
        turn: Turn,
        forwarded: dict[str, Any],
        exchange: Exchange,
        rewritten_messages: list[Any] | None = None,
        *,
        judge: bool = True,
    ) -> None:
        """The request as it goes upstream. ``rewritten_messages``: the pipeline's messages,
        when compaction changed them after. ``judge``: how it continues the session's last
        one is judged now; else by ``judge`` later, while the engine reads it."""
        messages = forwarded.get("messages")
        turn.request = forwarded
        turn.forwarded_messages = messages if isinstance(messages, list) else []
        turn.rewritten_messages = rewritten_messages
        turn.tools = forwarded.get("tools")
        turn.template_kwargs = forwarded.get("chat_template_kwargs")
        if judge:
            self.judge(turn, exchange)

    def judge(self, turn: Turn, exchange: Exchange) -> None:
        """How the forwarded request continues the session's last one: its prefix break and
        the cached tokens to expect, for the metrics and the log line (and a fan-out hold).
        Once, before the reply is remembered (which moves the session's last chain on).
        Hashing the forwarded messages is 35 us of a 256 KB step, better spent while the
        engine reads the request than before it is sent."""
        if turn.judged:
            return
        turn.judged = True
        if exchange.compaction:
            exchange.prefix_break = "compaction"
            exchange.expected_cached = 0
            return
        if not turn.full_history:
            exchange.prefix_break = "engine_history"
            return
        try:
            turn.forwarded_chain = turn.exact_chain(turn.forwarded_messages)
            continuity = prefix.classify(
                turn.session, turn.forwarded_messages, turn.tools, turn.forwarded_chain
            )
        except Exception as exc:  # fail open: a metric is not worth a request
            self._failures.failed("prefix continuity", exc)
            self._metrics.session_errors.inc()
            return
        exchange.prefix_break = continuity.reason
        if turn.learned and continuity.reason == "system_changed":
            exchange.prefix_break = "volatile_learned"  # its lines move from now on
        exchange.expected_cached = continuity.expected_cached
        exchange.learned_lines = turn.learned_moved

    def prepare(self, turn: Turn) -> None:
        """What the record of this request's reply needs of the request alone (its
        substitutions, its notes), worked out while the engine reads the request: not
        between the reply and the client's next request, and, streamed, not before the
        client hears [DONE]. Fail open: ``close`` works out what this did not."""
        try:
            self._substituted(turn)
            self._notes(turn)
        except Exception:  # close does it again, and reports what fails
            pass

    def _substituted(self, turn: Turn) -> list[tuple[bytes, Any]]:
        """This request's substitutions, and what restoration will give the next request
        for its history once they are saved."""
        if turn.substituted is None:
            rewritten = turn.rewritten_messages
            rewritten = turn.forwarded_messages if rewritten is None else rewritten
            client, keys = turn.client_messages, turn.keys
            found = record.recorded(
                client, rewritten, keys, lambda: turn.replaced_in(rewritten), turn.known
            )
            turn.substituted = found.substituted
            if turn.known is not None:
                turn.restore_next = restore.carried(
                    client, rewritten, keys, turn.lookup_keys, found
                )
        return turn.substituted

    def _notes(self, turn: Turn) -> tuple[tuple[bytes, ...], tuple[str, ...]] | tuple[()]:
        """Which messages carry the notes of volatile lines (see move_volatile), after
        this request: worked out once, from the record the request was rewritten with."""
        if turn.notes is None:
            turn.notes = notes_after(
                turn.client_messages,
                self.detector,
                turn.session,
                turn.lookup_keys,
                turn.keys,
                turn.known,
            )
        return turn.notes

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
            mask=turn.mask,
            keys=turn.keys,
            rewritten=turn.rewritten_messages,
            forwarded_chain=turn.forwarded_chain,
            memo=turn.memo,
            substituted=self._substituted(turn),
        )
        self._memos.keep(session.key, turn.memo)
        calls = exchange.reply.get("tool_calls")
        session.last_reply_tool_calls = len(calls) if isinstance(calls, list) else 0
        session.warmed, session.warmed_tokens = False, 0
        # The first values seen stay pinned for the session (setdefault: first wins).
        for key, value in pinnable(turn.template_kwargs, self.detector).items():
            session.pinned_template_kwargs.setdefault(key, value)
        # From the record the request was rewritten with (``session`` may be a fresher
        # load of it, after a lost compare and set).
        if notes := self._notes(turn):
            session.note_carriers, session.last_note_lines = notes
        lead = leading_system(turn.client_messages)
        session.system_key = turn.keys[lead - 1] if lead else b""
        if not session.head:
            exchanged = itertools.chain(turn.client_messages, (exchange.reply,))
            session.head = head_key(exchanged, self.detector.key) or b""

    @staticmethod
    def _carry_restoration(turn: Turn) -> None:
        """The next request of this conversation may take restoration's result for this
        one's history from here (proxy.rewrite.restore): its record is saved, and this
        record dropped none of its substitutions (the oldest go at MAX_SUBSTITUTIONS)."""
        carry, known, session = turn.restore_next, turn.known, turn.session
        if carry is None or known is None or len(session.substitutions) >= MAX_SUBSTITUTIONS:
            return
        known.restore_next = carry.once_saved(restore.saved(session))

    async def _point(self, alias: str, key: str) -> None:
        """The alias record of a new fingerprinted session points to it (the newest session
        with that alias wins)."""
        pointer = await self.store.get(alias) or Session(alias)
        if pointer.alias_of != key:
            pointer.alias_of = key
            await self.store.save(pointer)  # lost to another new session: it is as new

    async def _point_to(self, turn: Turn, key: str) -> None:
        """The records that lead to a saved session: its alias, its reply's response id."""
        if turn.alias:
            await self._point(turn.alias, key)
        if turn.response_id:
            await self._point(RESPONSE_PREFIX + turn.response_id, key)

    async def _save(self, turn: Turn, exchange: Exchange) -> None:
        """Compare and set. When another request of the session saved first (a retry, two
        sub-agents sharing a head, a background result), its record is loaded again and
        this reply recorded into it: both replies' substitutions survive; this one's
        follow-up state (compaction, pacing) gives way to the other's, which is as recent."""
        key = turn.session.key
        try:
            if await self.store.save(turn.session):
                self._metrics.sessions_saved.inc()
                self._carry_restoration(turn)
                await self._point_to(turn, key)
                return
            self._metrics.session_conflicts.inc()
            fresh = await self.store.get(key) or Session(key)
            if fresh.last_chain == turn.session.last_chain:
                return  # the other save recorded this same conversation and reply (a retry)
            # What this request learned of the system prompt when it opened, too: the
            # next request is compared with this one.
            fresh.system_digest = turn.session.system_digest
            fresh.system_lines = turn.session.system_lines
            fresh.learned = dict(turn.session.learned)
            self._remember(turn, fresh, exchange)
            if await self.store.save(fresh):
                self._metrics.sessions_saved.inc()
                if turn.response_id:
                    await self._point(RESPONSE_PREFIX + turn.response_id, key)
            else:
                log.warning("session %s changed twice during one save; reply not kept", key)
        except Exception as exc:  # fail open
            self._failures.failed("session save", exc)
            self._metrics.session_errors.inc()
