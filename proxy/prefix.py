"""Prefix continuity between a session's requests: did this request start with the previous
one plus its reply (what the engine has cached), and if not, where and why did it break?
Also what a session remembers after each reply. No I/O."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from proxy import tool_forms
from proxy.scans import replaced
from proxy.sessions import Session
from proxy.transcript import (
    Mask,
    Memo,
    chain_keys,
    exact_chain,
    exact_chain_after,
    matched_messages,
    next_key,
)

REASONS = (
    "new_session",
    "none",
    "system_changed",
    "tools_changed",
    "history_rewritten",
    "compaction",  # set by the tracker: the proxy compacted this request (proxy.compaction)
    "volatile_learned",  # set by the tracker: lines of the system prompt learned volatile
    # set by the tracker: the engine holds the history (a Responses previous_response_id),
    # the request carries only what is new, so its continuity is the engine's to judge
    "engine_history",
)


@dataclasses.dataclass(frozen=True)
class Continuity:
    reason: str  # one of REASONS
    matched: int  # leading messages equal to the previous request's (reply included)
    # Prompt tokens the engine should find cached, from the previous step's usage: all of
    # the previous prompt and reply when nothing broke, else that share of it (estimate).
    expected_cached: int


def tools_digest(tools: Any) -> bytes:
    return tool_forms.forms(tools).digest


def classify(
    session: Session | None,
    messages: Sequence[Any],
    tools: Any,
    chain: Sequence[bytes] | None = None,
) -> Continuity:
    """``chain``: ``exact_chain(messages)``, if already computed."""
    if session is None or not session.last_chain:
        return Continuity("new_session", 0, 0)
    chain = exact_chain(messages) if chain is None else chain
    matched = matched_messages(chain, session.last_chain)
    previous = session.last_prompt_tokens + session.last_completion_tokens
    if tools_digest(tools) != session.last_tools:
        return Continuity("tools_changed", matched, 0)
    if matched >= min(len(chain), len(session.last_chain)):
        return Continuity("none", matched, previous)
    share = matched / len(session.last_chain)
    first = messages[matched] if matched < len(messages) else None
    system = isinstance(first, dict) and first.get("role") in ("system", "developer")
    reason = "system_changed" if system else "history_rewritten"
    return Continuity(reason, matched, int(previous * share))


def remember(
    session: Session,
    client_messages: Sequence[Any],
    forwarded: Sequence[Any],
    tools: Any,
    reply: dict[str, Any] | None,
    prompt_tokens: int,
    completion_tokens: int,
    mask: Mask | None,
    keys: Sequence[bytes] | None = None,
    rewritten: Sequence[Any] | None = None,
    forwarded_chain: Sequence[bytes] | None = None,
    memo: Memo | None = None,
    substituted: Sequence[tuple[bytes, Any]] | None = None,
) -> None:
    """After a reply: record what was sent in place of each client message, and the reply
    as emitted, so the next request's history can be restored to exactly these bytes.
    ``keys``: the client messages' chain keys, if already computed. ``rewritten``: the
    pipeline's messages, one per client message, when compaction made ``forwarded``
    shorter (compaction keeps its own record, proxy.compaction). ``forwarded_chain``:
    ``exact_chain(forwarded)``, if already computed; ``memo``: the conversation's digests;
    ``substituted``: ``substitutions`` of this request, if already worked out."""
    # Read, never copied: a long history's keys and links are thousands a step.
    keys = keys if keys is not None else chain_keys(client_messages, mask)
    if substituted is None:
        rewritten = forwarded if rewritten is None else rewritten
        substituted = substitutions(client_messages, rewritten, keys)
    session.substitute_all(substituted)
    if forwarded_chain is None or len(forwarded_chain) != len(forwarded):
        forwarded_chain = exact_chain(forwarded, memo)
    replied: list[bytes] = []
    if reply is not None:
        session.substitute(next_key(keys[-1] if keys else None, reply, mask, memo), reply)
        last = forwarded_chain[-1] if forwarded_chain else None
        replied = exact_chain_after(last, [reply], memo)
    session.last_chain = (*forwarded_chain, *replied)
    session.last_tools = tools_digest(tools)
    session.last_prompt_tokens = prompt_tokens
    session.last_completion_tokens = completion_tokens


def substitutions(
    client_messages: Sequence[Any],
    rewritten: Sequence[Any],
    keys: Sequence[bytes],
    replaced_at: Iterable[int] | None = None,
) -> list[tuple[bytes, Any]]:
    """(key, message sent) for each client message the rewrites replaced: what the next
    request's history is restored to. Needs only the request (see ``remember``).
    ``rewritten``: the pipeline's messages, one per client message; ``replaced_at``:
    where they are not the client's objects, if known."""
    at = recorded_at(client_messages, rewritten, replaced_at)
    return [(keys[index], rewritten[index]) for index in at]


def recorded_at(
    client_messages: Sequence[Any],
    rewritten: Sequence[Any],
    replaced_at: Iterable[int] | None = None,
) -> list[int]:
    """Where ``substitutions`` records a message, in order."""
    if len(rewritten) != len(client_messages):
        return []
    found = []
    # The few the rewrites replaced: most are the client's own objects.
    if replaced_at is None:
        replaced_at = replaced(rewritten, client_messages)
    for index in replaced_at:
        sent, given = rewritten[index], client_messages[index]
        # A system prompt is rewritten afresh every time (its volatile values move to the
        # newest message); restoring an old one would hide the new values.
        if sent != given and not _is_system(given):
            found.append(index)
    return found


def _is_system(message: Any) -> bool:
    return isinstance(message, dict) and message.get("role") in ("system", "developer")
