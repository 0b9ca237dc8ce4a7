"""Sessions: which conversation a request belongs to, and what the proxy keeps about it.

No agent client sends a session id (none of those tests/e2e/test_clients.py drives), so
the usual key is a fingerprint of the conversation's stable head: the system prompt
without its volatile values, the tools in canonical form, and the first user message,
which usually states the task.
Conversations that share all three share a session; that is harmless, because what a
session holds is keyed by the conversation's own chained message keys (proxy.transcript).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import operator
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from proxy import jsonio, tool_forms
from proxy.compaction.state import Compaction
from proxy.scans import starts_with
from proxy.transcript import Mask

if TYPE_CHECKING:
    from proxy.known import Known

SESSION_HEADER = "x-session-id"
# Per session, the substitutions kept (oldest dropped first): a long agent session makes
# one or two per step, so this covers thousands of steps.
MAX_SUBSTITUTIONS = 4096
# Fewer substitutions than this are recorded one by one (``Session.substitute_all``).
FEW_SUBSTITUTED = 32


@dataclasses.dataclass
class Pace:
    """A session's rhythm, for timing warm-ups (proxy.warmup): when its last reply with
    tool calls went out (wall time: any replica reads it) and how long its recent tool
    rounds took, newest last."""

    replied_at: float | None = None
    gaps: list[float] = dataclasses.field(default_factory=list)

    def add_gap(self, seconds: float, keep: int) -> None:
        self.gaps = [*self.gaps[-(keep - 1) :], seconds] if keep > 1 else [seconds]


# Set on a record whose substitutions another record shares (not a field: never stored).
_SHARED = "_shares_substitutions"


@dataclasses.dataclass
class Session:
    """What the proxy remembers of one conversation: one typed record, loaded from the
    store when a request opens its session and saved when its reply is recorded
    (proxy.tracker). Nothing else writes it: background work posts its results to the
    tracker, which applies them to the next load."""

    key: str
    # chain key of a message as the client sends it -> the message to forward instead
    # (the assistant output as emitted, a user message with its context note, ...), least
    # recently recorded first. A dict, not an OrderedDict: a request copies a session's
    # substitutions to change them, and copying an OrderedDict of 1,700 cost 159 us, a
    # dict 6 us.
    substitutions: dict[bytes, dict[str, Any]] = dataclasses.field(default_factory=dict)
    pinned_template_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The volatile system-prompt lines the history's notes carry (proxy.rewrite.volatile),
    # and the keys of the client messages that carry those notes, oldest first.
    last_note_lines: tuple[str, ...] = ()
    note_carriers: tuple[bytes, ...] = ()
    # The previous request's system text (a digest, and a signature per line), and the line
    # shapes learned volatile from it, each with the requests since it last changed
    # (proxy.rewrite.learned).
    system_digest: bytes = b""
    system_lines: tuple[bytes, ...] = ()
    learned: dict[bytes, int] = dataclasses.field(default_factory=dict)
    # The chain key of the previous request's system prompt (its leading system and
    # developer messages): history recorded after it is found when the prompt changes.
    system_key: bytes = b""
    # The last forwarded conversation (messages + the reply), as exact-bytes hash chain.
    last_chain: tuple[bytes, ...] = ()
    last_tools: bytes = b""
    last_prompt_tokens: int = 0
    last_completion_tokens: int = 0
    # Tool calls in the last reply: the next request carries their results.
    last_reply_tool_calls: int = 0
    # Whether the proxy warmed the engine's cache for the next step (proxy.warmup), and
    # how many prompt tokens that left cached (0: not known, a warm-up by chat).
    warmed: bool = False
    warmed_tokens: int = 0
    pace: Pace = dataclasses.field(default_factory=Pace)
    # What compaction keeps for this session, and when its last summary failed.
    compaction: Compaction | None = None
    summary_failed_at: float | None = None
    # The engine this session's KV blocks live on ("": the only upstream), and the token a
    # router in front of the engines gave it (upstream_affinity_header).
    engine: str = ""
    router_token: str = ""
    # A fingerprinted conversation's first exchange (the chain key of its first two
    # messages after the system prompt), and, in an alias record, the key of the session
    # it points to: a request whose system prompt changed in a way not yet learned has a
    # new fingerprint, and is joined to its session through these (proxy.tracker).
    head: bytes = b""
    alias_of: str = ""
    # The stored version this record was loaded from (0: new): saves compare and set it.
    version: int = 0
    touched: float = 0.0

    def substitute(self, key: bytes, message: dict[str, Any]) -> None:
        substitutions = self._own_substitutions()
        substitutions.pop(key, None)  # to the end: the most recently recorded
        substitutions[key] = message
        if len(substitutions) > MAX_SUBSTITUTIONS:
            self.drop_oldest_substitutions(len(substitutions) - MAX_SUBSTITUTIONS)

    def substitute_all(self, substituted: Sequence[tuple[bytes, dict[str, Any]]]) -> None:
        """``substitute`` each (key, message) in turn. Many at once (a client that sends
        every reply back in another form has half its history restored, each recorded
        again every step) are merged in C: the keys not among them keep their order, then
        these follow in theirs, which is where one ``substitute`` after another leaves
        them (1,150 of them: 80 us, against 230 us one by one)."""
        fresh = dict(substituted)
        if len(substituted) < FEW_SUBSTITUTED or len(fresh) != len(substituted):
            for key, message in substituted:  # a key twice: the loop moves it to its last
                self.substitute(key, message)
            return
        kept = self.substitutions
        others = map(operator.not_, map(fresh.__contains__, kept))
        merged = dict(itertools.compress(kept.items(), others))
        merged.update(fresh)
        self.__dict__.pop(_SHARED, None)  # a new dict: shared with no other record
        self.substitutions = merged
        if len(merged) > MAX_SUBSTITUTIONS:
            self.drop_oldest_substitutions(len(merged) - MAX_SUBSTITUTIONS)

    def drop_oldest_substitutions(self, count: int) -> None:
        substitutions = self._own_substitutions()
        for key in list(itertools.islice(substitutions, count)):
            del substitutions[key]

    def _own_substitutions(self) -> dict[bytes, dict[str, Any]]:
        """The substitutions, copied first if another record shares them (``copy``).
        Change them only through this."""
        if self.__dict__.pop(_SHARED, False):
            self.substitutions = dict(self.substitutions)
        return self.substitutions

    def copy(self) -> Session:
        """A copy whose containers can change without touching this one (the messages in
        them are never changed in place, only replaced)."""
        # Field by field through __dict__: dataclasses.replace re-runs __init__ (10x slower,
        # and a store copies on every get and save).
        copied = object.__new__(Session)
        copied.__dict__.update(self.__dict__)
        # Both share the substitutions until one changes them (most requests add one or
        # two to a session's hundreds, and a store copies twice per request).
        self.__dict__[_SHARED] = copied.__dict__[_SHARED] = True
        copied.pinned_template_kwargs = dict(self.pinned_template_kwargs)
        copied.learned = dict(self.learned)
        copied.pace = Pace(self.pace.replied_at, list(self.pace.gaps))
        if self.compaction is not None:
            copied.compaction = self.compaction.copy()
        return copied


def identify(
    headers: Mapping[str, str],
    request: Mapping[str, Any],
    mask: Mask,
    conversation: str = "",
    known: Known | None = None,
) -> tuple[str, str]:
    """(session key, where it came from: header, user, prompt_cache_key, conversation (a
    Responses API conversation id) or fingerprint). ``known``: what the request knows of its
    messages (proxy.known), where the fingerprint of the request it continues is."""
    explicit = headers.get(SESSION_HEADER)
    if explicit:
        return "h:" + explicit, "header"
    for field in ("user", "prompt_cache_key"):
        value = request.get(field)
        if isinstance(value, str) and value:
            return f"{field[0]}:{value}", field
    if conversation:
        return "c:" + conversation, "conversation"
    return "f:" + fingerprint(request, mask, known=known), "fingerprint"


def fingerprint(
    request: Mapping[str, Any],
    mask: Mask,
    *,
    with_user: bool = True,
    with_system: bool = True,
    known: Known | None = None,
) -> str:
    """The conversation's stable head as a key. ``with_user=False``: only the system prompt
    and tools, the prefix a family of conversations shares (proxy.engines places a family
    together, so its shared prefix is computed once). ``with_system=False``: only tools and
    the first user message (the alias of a conversation whose system prompt changes).
    ``known``: what the request knows of its messages; a request whose messages up to the
    first user message are those of the one it continues (its very objects, compared in
    C: scans.starts_with), with its very tools, has that one's key (parsed values are never
    changed in place: proxy.known)."""
    messages = request.get("messages")
    messages = messages if isinstance(messages, list) else []
    tools = request.get("tools")
    form = (with_user, with_system)
    was = known.heads.get(form) if known is not None else None
    # (the mask: a bound method, equal each time but not the same object)
    if was and was[0] is tools and was[2] == mask and starts_with(messages, was[1]):
        return was[3]
    head: list[Any] = []
    end = 0  # the messages up to the first user message, where there is one
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        role, content = message.get("role"), message.get("content")
        if role in ("system", "developer"):
            if with_system:
                head.append([role, mask(content) if isinstance(content, str) else content])
        elif role == "user":
            if with_user:
                head.append(["user", content])
            end = index + 1
            break
    key = _fingerprint(head, tools)
    if known is not None and end:
        known.heads[form] = (tools, messages[:end], mask, key)
    return key


def _fingerprint(head: list[Any], tools: Any) -> str:
    forms = tool_forms.forms(tools) if isinstance(tools, list) else None
    # Every step of a conversation has the same head: its key is kept by the head's texts
    # and the tools' digest (encoding 20 KB of prompt and tools again was most of the cost).
    texts = tuple(itertools.chain.from_iterable(head))
    memo = None
    if set(map(type, texts)) <= {str}:  # all strings (without a generator: every request)
        memo = (texts, forms.digest if forms is not None else None)
        found = _fingerprints.get(memo)
        if found is not None:
            _fingerprints.move_to_end(memo)
            return found
    if forms is not None:
        head.append(list(forms.named))
    key = hashlib.blake2b(jsonio.dumps_canonical(head), digest_size=12).hexdigest()
    if memo is not None:
        _fingerprints[memo] = key
        if len(_fingerprints) > FINGERPRINTS_KEPT:
            _fingerprints.popitem(last=False)
    return key


# Distinct heads (prompt, first user message, tools) remembered: each holds its texts
# (a 20k-character prompt: 256 heads hold about 5 MB).
FINGERPRINTS_KEPT = 256
_fingerprints: collections.OrderedDict[tuple[tuple[str, ...], bytes | None], str] = (
    collections.OrderedDict()
)


class SessionStore(Protocol):
    """Where session records live: in this process (MemoryStore) or shared by every
    replica (proxy.redis_store). Calls may fail or time out; the tracker fails open."""

    # False: no call yields to the event loop, so nothing else runs between a reply going
    # out and its record being saved (a reply is then answered before it is recorded).
    waits: bool

    async def get(self, key: str) -> Session | None:
        """A copy of the stored record (the caller owns it), or None."""

    async def save(self, session: Session) -> bool:
        """Store ``session`` if the stored record is still the version it was loaded from
        (compare and set), and advance its version; False if another save came first."""

    async def delete(self, key: str) -> None: ...

    def held(self) -> int | None:
        """Records held, as last known (a gauge reads it at scrape time; None: unknown)."""

    async def aclose(self) -> None: ...


class MemoryStore:
    """Sessions in this process: least recently used dropped beyond ``max_sessions``, and
    any idle for ``ttl_s`` seconds. It keeps copies, so it behaves as a networked store
    does: nothing changes a stored record but a save. The calls never wait (one event
    loop: nothing runs between a compare and its set)."""

    waits = False

    def __init__(
        self, max_sessions: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._sessions: collections.OrderedDict[str, Session] = collections.OrderedDict()
        self._max = max_sessions
        self._ttl = ttl_s
        self._clock = clock

    async def get(self, key: str) -> Session | None:
        now = self._clock()
        self._expire(now)
        session = self._sessions.get(key)
        if session is None:
            return None
        session.touched = now
        self._sessions.move_to_end(key)
        return session.copy()

    async def save(self, session: Session) -> bool:
        stored = self._sessions.get(session.key)
        if stored is not None and stored.version != session.version:
            return False  # (a record dropped meanwhile may be saved again)
        session.version += 1
        kept = session.copy()
        kept.touched = self._clock()
        self._sessions[session.key] = kept
        self._sessions.move_to_end(session.key)
        while len(self._sessions) > self._max:
            self._sessions.popitem(last=False)
        return True

    async def delete(self, key: str) -> None:
        self._sessions.pop(key, None)

    def held(self) -> int:
        return len(self._sessions)

    async def aclose(self) -> None:
        pass

    def __len__(self) -> int:
        return len(self._sessions)

    def _expire(self, now: float) -> None:
        while self._sessions:
            oldest = next(iter(self._sessions.values()))
            if now - oldest.touched < self._ttl:
                return
            self._sessions.popitem(last=False)
