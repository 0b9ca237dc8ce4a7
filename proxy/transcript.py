"""Keys for the messages of a conversation: what the client sent, up to changes of form.

A message's *key* ignores what frameworks change when they send history back without
changing its meaning (tool-call arguments re-serialized, ``null`` vs ``""`` content,
surrounding whitespace, a dropped reasoning field, the volatile values of a system
prompt). Keys are chained, as vLLM chains block hashes: message i's key covers messages
0..i, so an equal key means an equal conversation so far. No I/O.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from proxy import jsonio
from proxy.known import Hashes, Known
from proxy.scans import same_run

Mask = Callable[[str], str]

# v2: chains of per-message digests; v3: long text messages hashed as their fields.
_ROOT = b"prefill-proxy/transcript/v3"
# Messages with text this long are hashed as their fields, not as canonical JSON: the
# escapes of a JSON tool result make its encoding most of its digest's cost (a 17 KB one:
# 43 -> 14 us, with SHA-256, which runs in hardware on current servers: SHA-NI, ARMv8's
# crypto extension); below it the encoder is the cheaper one. What those encodings start
# with is never the first byte of JSON text.
FLAT_MIN = 1024
_FLAT_EXACT, _FLAT_NORMAL = b"\x01", b"\x02"


def _text(content: Any) -> Any:
    if content is None:
        return ""
    if isinstance(content, str):
        return content.strip()
    if isinstance(content, list):  # content parts: text parts by their text, others as is
        return [
            part["text"].strip()
            if isinstance(part, dict)
            and part.get("type") == "text"
            and isinstance(part.get("text"), str)
            else part
            for part in content
        ]
    return content


def _arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:  # orjson: a third of the standard library's time in a request (jsonio's limits)
            return jsonio.loads(arguments)
        except ValueError:
            return arguments.strip()
    return arguments


def _tool_calls(calls: Any) -> Any:
    if not isinstance(calls, list):
        return calls
    normal = []
    for call in calls:
        if not isinstance(call, dict):
            normal.append(call)
            continue
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        normal.append([call.get("id"), function.get("name"), _arguments(function.get("arguments"))])
    return normal


def normal_form(message: Any, mask: Mask | None = None) -> Any:
    """What identifies a message, with the form changes of agent frameworks taken out."""
    if not isinstance(message, dict):
        return ["?", message]
    role = message.get("role")
    content = _text(message.get("content"))
    if mask is not None and role in ("system", "developer") and isinstance(content, str):
        content = mask(content)
    form = [role, content, message.get("name"), message.get("tool_call_id")]
    if message.get("tool_calls"):
        form.append(_tool_calls(message["tool_calls"]))
    return form


def _link(previous: bytes, digest: bytes) -> bytes:
    return _hash(previous + digest)


# BLAKE2b with a 16-byte digest, set up once: a copy of it hashes a link in 0.33 us, where
# building one with its parameters takes 0.56 (15-20 hashes a request).
_BLAKE2B_16 = hashlib.blake2b(digest_size=16)


def _hash(encoded: bytes) -> bytes:
    hasher = _BLAKE2B_16.copy()
    hasher.update(encoded)
    return hasher.digest()


def _long_text(text: Any) -> bool:
    return type(text) is str and len(text) >= FLAT_MIN


def _fields(hasher: Any, values: Iterable[Any]) -> bool:
    """Feed strings and nulls to ``hasher``, length-prefixed (they read back one way only);
    False at the first other value."""
    for value in values:
        if value is None:
            hasher.update(b"~")
        elif type(value) is str:
            encoded = value.encode()
            hasher.update(b"%d:" % len(encoded))
            hasher.update(encoded)
        else:
            return False
    return True


def normal_digest(message: Any, mask: Mask | None = None) -> bytes:
    form = normal_form(message, mask)
    if len(form) == 4 and _long_text(form[1]):  # role, text, name, tool_call_id
        hasher = hashlib.sha256(_FLAT_NORMAL)
        if _fields(hasher, form):
            return hasher.digest()[:16]
    return _hash(jsonio.dumps_canonical(form))


def exact_digest(message: Any) -> bytes:
    """Equal for equal JSON values, key order aside."""
    if type(message) is dict and _long_text(message.get("content")):
        hasher = hashlib.sha256(_FLAT_EXACT)
        if _fields(hasher, (part for item in sorted(message.items()) for part in item)):
            return hasher.digest()[:16]
    return _hash(jsonio.dumps_canonical(message))


def _frozen(value: Any) -> Any:
    """``value`` (parsed JSON) as a hashable value equal for equal JSON, key order aside."""
    if isinstance(value, dict):
        return frozenset((key, _frozen(item)) for key, item in value.items())
    if isinstance(value, list):
        return tuple(_frozen(item) for item in value)
    return (type(value), value) if isinstance(value, bool | float) else value


def _content_hash(message: Any) -> int:
    """A hash of ``message`` (parsed JSON) equal for equal JSON, key order aside. A flat
    message (role, content, tool_call_id: strings) hashes its items as they are (the
    strings' own hashes: a long tool result is not encoded again); any other (tool calls,
    content parts, numbers and booleans, which Python's hash confuses: ``True == 1``) by
    its canonical encoding, which for such small values is cheaper than walking them."""
    if type(message) is dict:
        for value in message.values():
            if type(value) is not str and value is not None:
                break
        else:
            return hash(frozenset(message.items()))
    try:
        return hash(jsonio.dumps_canonical(message))
    except jsonio.InvalidJSON:
        return hash(_frozen(message))


class Memo:
    """A conversation's message digests, carried from one of its requests to the next
    (proxy.tracker keeps one per session in this process): a message sent again is found
    by Python's hash of its content (C speed, a few times cheaper than encoding it
    canonically and hashing that) instead of being encoded again. Per conversation, so a
    64-bit hash only ever tells apart one conversation's messages; the digests are the
    same as without it (tests/unit/test_transcript_memo.py). System and developer messages
    are never memoized for keys: their key form depends on the session's mask."""

    def __init__(
        self,
        previous: Mapping[int, list[bytes | None]] | None = None,
        known: Known | None = None,
    ) -> None:
        self._previous = previous or {}
        self._seen: dict[int, list[bytes | None]] = {}  # what this request's messages use
        # Passed in (proxy.bodies), it already knows the messages this request shares with
        # the previous one as the same objects: their content hashes and chain links.
        self._known = Known() if known is None else known
        self._by_id: Hashes = self._known.hashes
        self._carried = 0  # messages whose links a chain took from the previous request
        self._messages = 0  # the longest list chained

    def _entry(self, message: Any) -> list[bytes | None]:
        """The digests of ``message``: those of that very object where the request knows
        it (its digests are its value's, whichever conversation worked them out: the
        first request of a conversation that shares a kept body's history, proxy.bodies,
        hashes none of it again), else those of its content in this conversation."""
        known = self._by_id.get(id(message))
        if known is not None and known[0] is message:
            self._seen.setdefault(known[1], known[2])
            return known[2]
        content = _content_hash(message)
        entry = self._seen.get(content)
        if entry is None:
            entry = self._seen[content] = list(self._previous.get(content) or (None, None))
        self._by_id[id(message)] = (message, content, entry)
        return entry

    def exact(self, message: Any) -> bytes:
        entry = self._entry(message)
        digest = entry[0]
        if digest is None:
            digest = entry[0] = exact_digest(message)
        return digest

    def normal(self, message: Any, mask: Mask | None) -> bytes:
        if isinstance(message, dict) and message.get("role") in ("system", "developer"):
            return normal_digest(message, mask)
        entry = self._entry(message)
        digest = entry[1]
        if digest is None:
            digest = entry[1] = normal_digest(message, mask)
            if entry[0] is None:
                self._exact_now(message, entry)
        return digest

    @staticmethod
    def _exact_now(message: Any, entry: list[bytes | None]) -> None:
        """A message new to the conversation gets its exact digest too, at once: the exact
        chain of the forwarded messages asks for it later in the request (most new
        messages are forwarded as they came), and hashed now, while the message and the
        hashing code are in the CPU's caches, it costs under half (a 1 KB tool result in
        the overhead benchmark: 16.6 -> 7.6 us). A message it cannot encode is left to the
        exact chain, which fails open."""
        with contextlib.suppress(jsonio.InvalidJSON):
            entry[0] = exact_digest(message)

    def chain(
        self,
        name: str,
        messages: Sequence[Any],
        tag: Any,
        digest: Callable[[Any], bytes],
    ) -> list[bytes]:
        """The chain of ``messages`` (each link: the previous one and ``digest`` of the
        message). Where the previous request of the conversation chained a list by this
        ``name`` and ``tag`` (equal mask), a message that is its own object at the same
        place, after links that came out the same, has its link taken as it was: the
        chain costs the messages that are new (or changed), not the history."""
        before_messages, before_tag, before = self._known.before.pop(name, ((), None, []))
        # Up to ``synced`` the chain so far is the previous one's (0: another mask).
        synced = min(len(before), len(before_messages)) if tag == before_tag else 0
        chain: list[bytes] = []
        previous = _ROOT
        index, count = 0, len(messages)
        while index < count:
            same = self._same_run(messages, before_messages, index, synced) if index < synced else 0
            if same:  # a run of the previous list's objects: their links as they were
                chain += before[index : index + same]
                index += same
                previous = chain[-1]
                self._carried += same
                continue
            previous = _link(previous, digest(messages[index]))
            chain.append(previous)
            if index < synced and previous != before[index]:
                synced = 0  # a message changed: the links after it are new
            index += 1
        self._known.chains[name] = (messages, tag, chain)
        self._messages = max(self._messages, len(messages))
        return chain

    def _same_run(self, now: Sequence[Any], before: Sequence[Any], start: int, stop: int) -> int:
        """``scans.same_run``, but for the leading messages the body cache made the previous
        list's objects (Known.lead): those are not looked at again."""
        lead = self._known.lead
        if lead is not None and start == 0 and now is lead[0] and before is lead[1]:
            known = min(lead[2], stop)
            return known + same_run(now, before, known, stop)
        return same_run(now, before, start, stop)

    def kept(self) -> dict[int, list[bytes | None]]:
        """The digests this request's messages used (and those of the previous request,
        for the messages whose links were carried, while that stays small): the next
        request's ``previous``. The previous request's dict gets this one's in place, not
        copied (a long history's thousands of entries a step): any request of the
        conversation that still reads it finds the same digest for the same content."""
        if self._carried:
            previous, seen = self._previous, self._seen
            if type(previous) is not dict:
                previous = dict(previous)
            merged = len(previous) + sum(1 for content in seen if content not in previous)
            if merged <= 2 * self._messages + 64:
                previous.update(seen)
                return previous
        return self._seen


class Memos:
    """Each recent session's message digests, in this process only (a request of a session
    that lands on another replica computes what it lacks), bounded by digests held (about
    150 bytes each): least recently used sessions dropped. ``limit`` 0: no memos."""

    def __init__(self, limit: int = 1 << 17) -> None:
        self._limit = limit
        self._held = 0
        self._memos: collections.OrderedDict[str, dict[int, list[bytes | None]]] = (
            collections.OrderedDict()
        )

    def get(self, key: str) -> dict[int, list[bytes | None]] | None:
        return self._memos.get(key)

    def keep(self, key: str, memo: Memo | None) -> None:
        if memo is None or not self._limit:
            return
        held = len(self._memos.pop(key, {}))  # before kept() may add to that very dict
        kept = memo.kept()
        self._held += len(kept) - held
        self._memos[key] = kept
        while self._held > self._limit and self._memos:
            self._held -= len(self._memos.popitem(last=False)[1])


def _normal(message: Any, mask: Mask | None, memo: Memo | None) -> bytes:
    return memo.normal(message, mask) if memo is not None else normal_digest(message, mask)


def chain_keys(
    messages: Sequence[Any], mask: Mask | None = None, memo: Memo | None = None
) -> list[bytes]:
    """Key i identifies messages[0..i] up to form changes."""
    if memo is not None:
        return memo.chain("keys", messages, mask, lambda message: memo.normal(message, mask))
    keys: list[bytes] = []
    previous = _ROOT
    for message in messages:
        previous = _link(previous, _normal(message, mask, memo))
        keys.append(previous)
    return keys


def matched_messages(chain: Sequence[bytes], before: Sequence[bytes]) -> int:
    """How many leading messages of two chains are equal. Link i of a chain covers
    messages 0..i, so links are equal up to the first difference and unequal after it:
    found by bisection, a few comparisons whatever the history's length."""
    common = min(len(chain), len(before))
    return bisect.bisect_left(range(common), True, key=lambda i: chain[i] != before[i])


def next_key(
    previous: bytes | None, message: Any, mask: Mask | None = None, memo: Memo | None = None
) -> bytes:
    """The key a message appended after ``previous`` will have."""
    return _link(previous or _ROOT, _normal(message, mask, memo))


def exact_chain(messages: Sequence[Any], memo: Memo | None = None) -> list[bytes]:
    """Hashes of the exact values: message i's covers messages 0..i (prefix comparison).
    Key order is left out: chat templates read fields by name, so it never reaches the
    prompt (clients re-order keys freely, e.g. pydantic's model_dump)."""
    if memo is not None:
        return memo.chain("exact", messages, None, memo.exact)
    return exact_chain_after(None, messages)


def exact_chain_after(
    previous_hash: bytes | None, messages: Sequence[Any], memo: Memo | None = None
) -> list[bytes]:
    """``exact_chain`` of messages that follow the one whose hash is ``previous_hash``."""
    hashes: list[bytes] = []
    previous = previous_hash or _ROOT
    for message in messages:
        digest = memo.exact(message) if memo is not None else exact_digest(message)
        previous = _link(previous, digest)
        hashes.append(previous)
    return hashes
