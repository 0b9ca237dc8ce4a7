"""What the proxy derives from a request's tool list, worked out once per distinct list.

An agent sends the same tools on every step (14 tools, 10 KB, in the dev traces), and
several parts of a request's path need their canonical form: the session fingerprint
(each tool's canonical encoding) and the continuity check (a digest of the whole list).
Encoding them canonically costs about five times what their plain encoding does, so the
forms are kept by the plain encoding: equal bytes, equal tools. No I/O.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
from typing import Any

from proxy import jsonio
from proxy.identity import ByIdentity

KEPT = 256  # distinct tool lists remembered (least recently used dropped)


@dataclasses.dataclass(frozen=True)
class ToolForms:
    digest: bytes  # of the whole value's canonical encoding (key order aside)
    named: tuple[str, ...]  # each object tool's canonical encoding, sorted
    # The plain encoding they were kept by (None: too deep to encode plainly), one object
    # for every request that brings these tools (proxy.rewrite.canonical_tools's key).
    encoded: bytes | None = dataclasses.field(default=None, compare=False)


SAME_KEPT = 64  # recent lists also answered by identity
_kept: collections.OrderedDict[bytes, ToolForms] = collections.OrderedDict()
# Recent lists asked about, by identity: a request asks three times (its fingerprint, its
# continuity, its record) about the same object, and a session's next steps bring it
# again where their bodies continue an earlier one (proxy.bodies parses its tools once).
_same: ByIdentity[ToolForms] = ByIdentity(SAME_KEPT)


def forms(tools: Any) -> ToolForms:
    """The canonical forms of ``tools`` (any value: None and malformed lists too)."""
    same = _same.get(tools)
    if same is not None:
        return same
    try:
        encoded = jsonio.dumps(tools)
    except jsonio.InvalidJSON:  # too deep to encode plainly: worked out, not kept
        return _work_out(tools)
    known = _kept.get(encoded)
    if known is not None:
        _kept.move_to_end(encoded)
    else:
        known = _kept[encoded] = _work_out(tools, encoded)
        if len(_kept) > KEPT:
            _kept.popitem(last=False)
    return _same.put(tools, known)


def _work_out(tools: Any, encoded: bytes | None = None) -> ToolForms:
    digest = hashlib.blake2b(jsonio.dumps_canonical(tools), digest_size=16).digest()
    named: tuple[str, ...] = ()
    if isinstance(tools, list):
        objects = (tool for tool in tools if isinstance(tool, dict))
        named = tuple(sorted(jsonio.dumps_canonical(tool).decode() for tool in objects))
    return ToolForms(digest, named, encoded)
