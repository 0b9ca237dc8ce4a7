"""proxy.identity: a value is found for the very object it was worked out of, never for an
equal one, and the least recently used objects go first."""

from __future__ import annotations

from proxy.identity import ByIdentity


def test_a_value_is_found_by_the_object_itself() -> None:
    kept: ByIdentity[str] = ByIdentity(4)
    message = {"role": "system", "content": "You are an agent."}
    assert kept.put(message, "worked out") == "worked out"
    assert kept.get(message) == "worked out"
    assert kept.get({**message}) is None  # equal, another object


def test_the_least_recently_used_object_goes_first() -> None:
    kept: ByIdentity[int] = ByIdentity(2)
    first, second, third = [1], [2], [3]
    kept.put(first, 1)
    kept.put(second, 2)
    assert kept.get(first) == 1  # used: now the most recent
    kept.put(third, 3)
    assert len(kept) == 2
    assert kept.get(second) is None
    assert (kept.get(first), kept.get(third)) == (1, 3)
