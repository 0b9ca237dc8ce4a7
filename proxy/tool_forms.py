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

KEPT = 256  # distinct tool lists remembered (least recently used dropped)


@dataclasses.dataclass(frozen=True)
class ToolForms:
    digest: bytes  # of the whole value's canonical encoding (key order aside)
    named: tuple[str, ...]  # each object tool's canonical encoding, sorted


_kept: collections.OrderedDict[bytes, ToolForms] = collections.OrderedDict()
# The last list asked about, by identity: a request asks three times (its fingerprint,
# its continuity, its record) about the same object, which requests never change in
# place; holding it keeps the identity meaningful.
_last: tuple[Any, ToolForms] | None = None


def forms(tools: Any) -> ToolForms:
    """The canonical forms of ``tools`` (any value: None and malformed lists too)."""
    global _last
    if _last is not None and _last[0] is tools:
        return _last[1]
    try:
        encoded = jsonio.dumps(tools)
    except jsonio.InvalidJSON:  # too deep to encode plainly: worked out, not kept
        return _work_out(tools)
    known = _kept.get(encoded)
    if known is not None:
        _kept.move_to_end(encoded)
    else:
        known = _kept[encoded] = _work_out(tools)
        if len(_kept) > KEPT:
            _kept.popitem(last=False)
    _last = (tools, known)
    return known


def _work_out(tools: Any) -> ToolForms:
    digest = hashlib.blake2b(jsonio.dumps_canonical(tools), digest_size=16).digest()
    named: tuple[str, ...] = ()
    if isinstance(tools, list):
        objects = (tool for tool in tools if isinstance(tool, dict))
        named = tuple(sorted(jsonio.dumps_canonical(tool).decode() for tool in objects))
    return ToolForms(digest, named)
