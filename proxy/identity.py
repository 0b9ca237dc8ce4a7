"""Values worked out of parsed or rewritten objects, kept by the objects' identity.

A session's next step brings the same objects again: the body cache (proxy.bodies) hands
it the earlier parse's messages and tools, and a rewrite that finds the same input makes
the same output object again where it keeps it here. Whatever was worked out of such an
object (its rewritten form, its encoding) is then a lookup. Requests are never changed in
place, so a value worked out of an object stays right for as long as the object lives;
holding the object keeps its id from being reused. Bounded: least recently used dropped.
"""

from __future__ import annotations

import collections
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class ByIdentity(Generic[V]):
    """Up to ``size`` objects and what was worked out of each."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._kept: collections.OrderedDict[int, tuple[Any, V]] = collections.OrderedDict()

    def get(self, obj: Any) -> V | None:
        # An id found here is this object's: the entry holds the object it was made for,
        # so no other object can have that id while the entry is kept.
        kept = self._kept.get(id(obj))
        if kept is None:
            return None
        self._kept.move_to_end(id(obj))
        return kept[1]

    def put(self, obj: Any, value: V) -> V:
        self._kept[id(obj)] = (obj, value)
        self._kept.move_to_end(id(obj))
        if len(self._kept) > self._size:
            self._kept.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._kept)
