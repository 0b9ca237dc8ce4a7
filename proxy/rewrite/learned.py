"""Volatile lines learned from the session itself, whatever their format.

The patterns of ``proxy.rewrite.volatile`` know some ways to write a clock; agents write
others ("It is now 08:07 on 29 November.", "Step 4 of 60", "Local time: 08:07:51", a
scratchpad that gains a line each step). What changes in the system prompt between two
requests of one conversation, while the rest stays, is volatile by definition. The rules:

- A line whose text changed while its *shape* did not (its text with the patterns' values
  masked and every number made 0: a new time, count or nonce) is learned at once, by
  shape.
- Lines inserted (at most ``MAX_BLOCK`` in one place) are learned at once, by text: a
  scratchpad or memory block that grows keeps the prefix from its first growth on.
- Labelled lines whose values changed in words ("Status: idle" -> "Status: on a call",
  "Open files: a.py" -> "Open files: a.py, b.py") are learned at once, by text.
- Other lines that replace lines of other shapes (words edited) are learned when the
  previous request changed the same place too (next to the same line), or when they join
  lines already learned. A prompt edited once is learned nothing (one miss, as without
  the proxy).
- A learned line whose block goes ``UNLEARN_AFTER`` requests without a change (an edit of
  a number, a block that stopped growing) is unlearned, so it goes back into the prefix:
  never a permanently moved line.

``move_volatile`` moves learned lines to the tail like pattern lines; the chain keys of
the session's messages leave its learned lines out (``keyed``), so history is restored
while a block grows. Pure functions over the
session record's two fields: the previous request's line signatures and the learned keys
with their unchanged counts.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from proxy.known import Known
from proxy.scans import CLIENT_MESSAGES, with_role

# Requests a learned line may go unchanged before it goes back into the system prompt.
UNLEARN_AFTER = 16
SOURCE_ROLES = frozenset({"system", "developer"})  # whose lines may be volatile
_DIGIT = re.compile(r"\d")
_NUMBER = re.compile(r"\d+")
_WORD = re.compile(r"\w")

Mask = Callable[[str], str]


def shape(text: str, mask: Mask) -> str:
    """``text`` with the patterns' values masked and every run of digits made one 0
    (9 -> 10 keeps the shape)."""
    return _NUMBER.sub("0", mask(text))


@functools.lru_cache(maxsize=1 << 16)
def shape_key(line: str, mask: Mask) -> bytes:
    """8 bytes of the line's shape. Cached: a system prompt's lines come again with every
    request of every conversation that shares it, and are tested several times each."""
    return hashlib.blake2b(shape(line, mask).encode(), digest_size=8).digest()


def signature(line: str, mask: Mask) -> bytes:
    """24 bytes: the line's text hash, its shape's, and its label's (zeros: none)."""
    return _text_key(line) + shape_key(line, mask) + _label_key(line)


_LABEL = re.compile(r"\s*([^:\n]{1,40}?)\s*:(?:\s|$)")
_NO_LABEL = bytes(8)


@functools.lru_cache(maxsize=256)
def signatures(lines: tuple[str, ...], mask: Mask) -> tuple[bytes, ...]:
    """Each line's signature, once per system prompt (text_lines): every new conversation
    that shares a prompt starts with the same lines."""
    return tuple(signature(line, mask) for line in lines)


def _label_key(line: str) -> bytes:
    """The hash of a line's label ("Status" in "Status: idle"), if it has one."""
    match = _LABEL.match(line)
    if match is None or not any(c.isalpha() for c in match.group(1)):
        return _NO_LABEL
    return hashlib.blake2b(match.group(1).encode(), digest_size=8).digest()


def system_texts(messages: Any, known: Known | None = None) -> tuple[str, ...]:
    """The text of each system and developer message (of each text part), in order
    (``known``: what the request knows of its messages, proxy.known.Known)."""
    texts: list[str] = []
    if not isinstance(messages, list):
        return ()
    for index in with_role(messages, SOURCE_ROLES, known, CLIENT_MESSAGES):
        content = messages[index].get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    texts.append(part["text"])
    return tuple(texts)


@functools.lru_cache(maxsize=256)
def text_lines(texts: tuple[str, ...]) -> tuple[tuple[str, ...], bytes]:
    """The lines of ``texts`` (system_texts) and their digest, worked out once per
    system prompt: a session's next step mostly brings the same string objects again
    (proxy.bodies), whose hashes Python keeps, so this is a lookup."""
    lines = tuple(line for text in texts for line in text.split("\n"))
    return lines, hashlib.blake2b("\n".join(lines).encode(), digest_size=16).digest()


@functools.lru_cache(maxsize=256)
def learned_count(lines: tuple[str, ...], test: Callable[[str], bool]) -> int:
    """How many of ``lines`` ``test`` (learned_line: one object per learned set) takes."""
    return sum(1 for line in lines if test(line))


def learn(
    previous: Sequence[bytes],
    current: Sequence[bytes],
    learned: Mapping[bytes, int],
    learnable: Sequence[bool] | None = None,
) -> tuple[dict[bytes, int], int]:
    """(the learned keys after this request, how many lines it learned), from the line
    signatures of the previous request and of this one. ``learnable[j]``: whether line j
    may be learned as a block line (blank lines and rules never are: learning one would
    move every blank line)."""
    state = _State(dict(learned), current, learnable)
    # The same signatures (an unchanged prompt, most steps) are not compared line by line.
    if previous is not current and list(previous) != list(current):
        matcher = difflib.SequenceMatcher(
            None, [s[8:16] for s in previous], [s[8:16] for s in current], autojunk=False
        )
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                state.values_changed(previous[i1:i2], j1)
            elif tag != "delete" and max(i2 - i1, j2 - j1) <= MAX_BLOCK:
                relabelled = tag == "replace" and _same_labels(previous[i1:i2], current[j1:j2])
                state.block_changed(j1, j2, at_once=tag == "insert" or relabelled)
    return state.counted(), state.new


# A changed block of at most this many lines may be learned: a scratchpad grows by a few
# lines a step; a section inserted or rewritten is an edit.
MAX_BLOCK = 8
_TEXT, _BEFORE, _AFTER = b"t", b"<", b">"  # key tags: block line, pending anchors
_START, _END = b"^" * 8, b"$" * 8  # anchors at the prompt's ends


def _same_labels(before: Sequence[bytes], after: Sequence[bytes]) -> bool:
    """Lines that kept their labels and changed their values ("Status: idle" -> "Status:
    on a call", "Open files: a.py" -> "Open files: a.py, b.py")."""
    return len(before) == len(after) and all(
        old[16:] == new[16:] != _NO_LABEL for old, new in zip(before, after, strict=True)
    )


class _State:
    """One request's learning: keys set or touched by it restart their counts."""

    def __init__(
        self, learned: dict[bytes, int], current: Sequence[bytes], learnable: Sequence[bool] | None
    ) -> None:
        self.learned = learned
        self.current = current
        self.learnable = learnable
        self.touched: set[bytes] = set()
        self.new = 0

    def is_learned(self, j: int) -> bool:
        sig = self.current[j]
        return sig[8:16] in self.learned or _TEXT + sig[:8] in self.learned

    def learn(self, key: bytes) -> None:
        if key not in self.learned:
            self.new += 1
        self.learned[key] = 0
        self.touched.add(key)

    def values_changed(self, before: Sequence[bytes], j1: int) -> None:
        """Aligned lines of one shape: a text that changed is a value, learned at once."""
        for offset, old in enumerate(before):
            j = j1 + offset
            if old[:8] != self.current[j][:8]:
                self.learn(self.current[j][8:16])
                self.touch_around(j, j + 1)

    def block_changed(self, j1: int, j2: int, *, at_once: bool) -> None:
        """Lines j1..j2 are new: inserted, or labelled lines with new values (``at_once``:
        learned now, a block that grows, a status that changes), or replacing lines of
        other shapes (an edit, as far as is known: learned when the previous request
        changed the same place too, next to the same line); and any that join lines
        already learned. Else the place is remembered for one request."""
        before = self.current[j1 - 1][8:16] if j1 > 0 else _START
        after = self.current[j2][8:16] if j2 < len(self.current) else _END
        joins = (j1 > 0 and self.is_learned(j1 - 1)) or (
            j2 < len(self.current) and self.is_learned(j2)
        )
        again = any(  # a place remembered by the previous request (not this one)
            key in self.learned and key not in self.touched
            for key in (_BEFORE + before, _AFTER + after)
        )
        if not (at_once or joins or again):
            for pending in (_BEFORE + before, _AFTER + after):
                self.learned[pending] = 0
                self.touched.add(pending)
            return
        for j in range(j1, j2):
            if self.learnable is None or self.learnable[j]:
                self.learn(_TEXT + self.current[j][:8])
        self.touch_around(j1, j2)

    def touch_around(self, j1: int, j2: int) -> None:
        """Learned lines next to a change are one block with it: their counts restart."""
        j = j1 - 1
        while j >= 0 and self.is_learned(j):
            self.touch(j)
            j -= 1
        j = j2
        while j < len(self.current) and self.is_learned(j):
            self.touch(j)
            j += 1

    def touch(self, j: int) -> None:
        sig = self.current[j]
        for key in (sig[8:16], _TEXT + sig[:8]):
            if key in self.learned:
                self.learned[key] = 0
                self.touched.add(key)

    def counted(self) -> dict[bytes, int]:
        """Every key not touched one request older: a pending place lives one request,
        a learned line ``UNLEARN_AFTER`` (present and unchanged, or gone)."""
        for key in list(self.learned):
            if key in self.touched:
                continue
            if key[:1] in (_BEFORE, _AFTER) and len(key) == 9:
                del self.learned[key]
                continue
            self.learned[key] += 1
            if self.learned[key] >= UNLEARN_AFTER:
                del self.learned[key]
        return self.learned


# Shapes a family record keeps (proxy.tracker: conversations sharing a system prompt).
MAX_FAMILY_SHAPES = 32


def seeded(family: dict[bytes, int], shapes: Iterable[bytes]) -> None:
    """A new session started with ``shapes`` of its family: each seeds ``UNLEARN_AFTER``
    sessions, then a session that learns it again renews it (``taught``)."""
    for key in shapes:
        if key in family:
            family[key] += 1
            if family[key] >= UNLEARN_AFTER:
                del family[key]


def taught(family: dict[bytes, int], shapes: Iterable[bytes]) -> None:
    """A session learned ``shapes`` itself: they seed again (the newest kept)."""
    for key in shapes:
        family.pop(key, None)
        family[key] = 0
    while len(family) > MAX_FAMILY_SHAPES:
        del family[next(iter(family))]


def learnable(line: str) -> bool:
    """Whether a line may be learned as part of a block: it has a word or number in it."""
    return bool(_WORD.search(line))


def learned_line(learned: Iterable[bytes] | None, mask: Mask) -> Callable[[str], bool] | None:
    """A test of whether a line is learned: one of ``learned``'s shapes, or a block line
    by its text (None: nothing learned)."""
    shapes, texts = _split(learned)
    if not shapes and not texts:
        return None
    return _learned_test(shapes, texts, mask)


@functools.lru_cache(maxsize=1024)
def _learned_test(
    shapes: frozenset[bytes], texts: frozenset[bytes], mask: Mask
) -> Callable[[str], bool]:
    """One test object per learned set: what is split with it is cached by it."""

    def test(line: str) -> bool:
        if texts and _text_key(line) in texts:
            return True
        return bool(shapes) and bool(_DIGIT.search(line)) and shape_key(line, mask) in shapes

    return test


@functools.lru_cache(maxsize=1024)
def keyed(base: Mask, test: Callable[[str], bool] | None) -> Mask:
    """The session's key form of a system text: ``base`` (numbers 0, patterns masked) of
    the text without its learned lines (``test``, from ``learned_line``), so a block that
    grows or changes keeps the messages' chain keys, and with them restored history.
    One object per pair: a request keyed as its session's previous one has its chain
    links carried (proxy.transcript.Memo.chain)."""
    if test is None:
        return base

    def key(text: str) -> str:
        return base("\n".join(line for line in text.split("\n") if not test(line)))

    return key


def shapes(learned: Iterable[bytes] | None) -> frozenset[bytes]:
    """The line shapes among learned keys (what a family shares: block lines are one
    conversation's own)."""
    return _split(learned)[0]


def _split(learned: Iterable[bytes] | None) -> tuple[frozenset[bytes], frozenset[bytes]]:
    """(learned shapes, learned block lines' text keys)."""
    shapes: set[bytes] = set()
    texts: set[bytes] = set()
    for key in learned or ():
        if len(key) == 8:
            shapes.add(key)
        elif key[:1] == _TEXT and len(key) == 9:
            texts.add(key[1:])
    return frozenset(shapes), frozenset(texts)


def _text_key(line: str) -> bytes:
    return hashlib.blake2b(line.encode(), digest_size=8).digest()
