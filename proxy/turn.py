"""One request of a session, from lookup to recorded reply: what the tracker
(proxy.tracker) found and worked out for it, which compaction, warm-up and the record
read, and what is worked out of its lists once for them all."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from proxy.known import Known
from proxy.scans import replaced
from proxy.sessions import Session
from proxy.transcript import Memo, exact_chain

if TYPE_CHECKING:
    from proxy.rewrite.restore import Carried

# The name ``replaced_in`` keeps its list by (Turn._once), which ``replaced_more_than`` reads.
_REPLACED = "replaced"


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
    warmed_tokens: int = 0
    # Lines of the system prompt learned volatile by this request (proxy.rewrite.learned).
    learned: int = 0
    learned_moved: int = 0  # lines moved because they were learned
    # The session's key form of system text (learned block lines left out), and the alias
    # a new fingerprinted session is saved under too (proxy.tracker.SessionTracker._continued).
    mask: Callable[[str], str] = str
    alias: str = ""
    # The keys restoration looks history up by (proxy.history.history_keys).
    lookup_keys: list[bytes] = dataclasses.field(default_factory=list)
    # The conversation's message digests (proxy.transcript.Memo), and the exact chain of
    # the forwarded messages once computed.
    memo: Memo | None = None
    # What is known of the client's parsed messages (proxy.known.Known), if anything.
    known: Known | None = None
    forwarded_chain: list[bytes] | None = None
    body_bytes: int = 0  # the client's body, as received
    # False when the engine holds the earlier history (previous_response_id): the request
    # carries only new items, so nothing is compacted, judged or warmed from it.
    full_history: bool = True
    # The Responses API id of the reply, pointed to this session when saved (a later
    # request chaining on it finds the session, and so the engine that stored it).
    response_id: str = ""
    # The record's note carriers and lines after this request, and its substitutions
    # (proxy.prefix.substitutions); None: not worked out yet (SessionTracker.prepare).
    notes: tuple[tuple[bytes, ...], tuple[str, ...]] | tuple[()] | None = None
    substituted: list[tuple[bytes, Any]] | None = None
    # What restoration will give the next request for this one's history, once this
    # request's record is saved (proxy.rewrite.restore.carried).
    restore_next: Carried | None = None
    judged: bool = False  # its continuity of the session (SessionTracker.judge)
    recorded: bool = False

    def __post_init__(self) -> None:
        if not self.lookup_keys:
            self.lookup_keys = self.keys
        # What was worked out of a list, by the name of the work: (the list, the result).
        self._worked_out: dict[str, tuple[list[Any], Any]] = {}

    def exact_chain(self, messages: list[Any]) -> list[bytes]:
        """``exact_chain`` of ``messages`` (this request's forwarded messages), worked out
        once per list: compaction reads it before the tracker records it."""
        return self._once("exact chain", messages, lambda: exact_chain(messages, self.memo))

    def replaced_in(self, messages: list[Any]) -> list[int]:
        """Where ``messages`` (this request's rewritten or forwarded list) holds other
        objects than the client's list, worked out once per list: the splice, the
        compaction bound and the record each ask, and the rewrites replace a few."""
        return self._once(
            _REPLACED, messages, lambda: list(replaced(messages, self.client_messages))
        )

    def replaced_more_than(self, messages: list[Any], count: int) -> bool:
        """Whether ``messages`` holds other objects than the client's list at more than
        ``count`` places: from ``replaced_in`` where it was worked out for this list, else
        by a scan that stops at the one past ``count`` (a history with every other
        message restored is looked at for its first few dozen). A scan that found no more
        than ``count`` went through the whole list: ``replaced_in``'s answer, kept for it
        (the compaction bound asks both of the same list; 1,900 messages: 25-60 us a scan)."""
        held = self._worked_out.get(_REPLACED)
        if held is not None and held[0] is messages:
            return len(held[1]) > count
        if count < 0:
            return True
        found = list(itertools.islice(replaced(messages, self.client_messages), count + 1))
        if len(found) <= count:
            self._worked_out[_REPLACED] = (messages, found)
        return len(found) > count

    def _once(self, work: str, messages: list[Any], result: Callable[[], Any]) -> Any:
        """``result()``, worked out again only for another list than the last one."""
        held = self._worked_out.get(work)
        if held is None or held[0] is not messages:
            held = self._worked_out[work] = (messages, result())
        return held[1]
