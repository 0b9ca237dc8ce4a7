"""What compaction keeps per session, and the compacted view of a request built from it.

The client keeps sending its whole history; the proxy recognises the part it folded by the
chain key of the last folded message (proxy.transcript: a key covers the conversation up
to that message), and sends the same stand-in in its place every time. So between two
compaction events every request starts with the same bytes, and the engine's prefix cache
keeps working. No I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from proxy.compaction import plan


@dataclasses.dataclass
class Compaction:
    # Key of the last client message folded into the stand-in; None: nothing folded yet.
    cut_key: bytes | None = None
    cut_hint: int = 0  # where that message was last seen
    stand_in: dict[str, Any] | None = None  # the summary (or marker) message
    summary: str | None = None  # the running summary's text, extended at the next event
    facts: list[str] = dataclasses.field(default_factory=list)
    # key of an elided tool result -> (its stand-in, the stand-in's token estimate)
    elided: dict[bytes, tuple[dict[str, Any], int]] = dataclasses.field(default_factory=dict)
    events: int = 0
    # Set by an event decided after a reply (and warmed); reported by the request that
    # first uses it.
    unreported: str = ""
    # Token estimates: per message key, and engine tokens / estimate from the last reply.
    sizes: dict[bytes, int] = dataclasses.field(default_factory=dict)
    ratio: float = 1.0
    last_estimate: int = 0
    # Engine tokens of the last exchange (prompt + completion), to see a step's growth.
    last_used: int = 0

    def copy(self) -> Compaction:
        """A copy whose facts and elisions can change without touching this one (the token
        estimates by key are shared: an estimate is the same in every copy). Field by
        field, as Session.copy: dataclasses.replace re-runs __init__, 10 us of a request
        whose record a store copies twice."""
        copied = object.__new__(Compaction)
        copied.__dict__.update(self.__dict__)
        copied.facts = list(self.facts)
        copied.elided = dict(self.elided)
        return copied


@dataclasses.dataclass(frozen=True)
class View:
    messages: list[Any]
    cut: int  # first client message kept after the stand-in (0: nothing folded)
    sizes: list[int]  # token estimate of each message of ``messages``


def find_cut(state: Compaction, keys: Sequence[bytes]) -> int | None:
    """Index after the last folded message in this request; 0 if nothing is folded; None
    if the folded part is not in this request any more (the client changed its history)."""
    if state.cut_key is None:
        return 0
    hint = state.cut_hint
    if hint < len(keys) and keys[hint] == state.cut_key:
        return hint + 1
    for index in range(len(keys) - 1, -1, -1):
        if keys[index] == state.cut_key:
            state.cut_hint = index
            return index + 1
    return None


def view(
    state: Compaction,
    messages: Sequence[Any],
    keys: Sequence[bytes],
    sizes: Sequence[int],
    head: int,
    cut: int,
    stand_in_size: int,
) -> View:
    """The request's messages with the stand-in and the elisions of ``state`` applied."""
    cut = max(cut, head)
    stand_in = state.stand_in if cut > head else None
    out = plan.compacted(messages, head, stand_in, cut)
    out_sizes = [*sizes[:head], *([stand_in_size] if stand_in is not None else []), *sizes[cut:]]
    if state.elided:
        offset = len(out) - (len(messages) - cut)
        for index in range(cut, len(messages) - 1):  # the newest message is never elided
            replacement = state.elided.get(keys[index])
            if replacement is not None:
                out[offset + index - cut], out_sizes[offset + index - cut] = replacement
    return View(out, cut if cut > head else 0, out_sizes)
