"""Session fingerprints kept by their head (proxy.sessions) are the fingerprints worked
out afresh, for every variant and mask: many heads kept at once never answer for each
other."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import sessions
from proxy.rewrite.detector import DEFAULT_DETECTOR
from tests.support.conversations import conversations

TOOLS = st.lists(
    st.fixed_dictionaries({"type": st.just("function"), "name": st.sampled_from("abc")}),
    max_size=3,
)
VARIANTS = [
    (user, system, mask)
    for user in (True, False)
    for system in (True, False)
    for mask in (DEFAULT_DETECTOR.key, str)
]


def keys(requests: list[dict[str, Any]], *, afresh: bool) -> list[str]:
    found = []
    for request in requests:
        for with_user, with_system, mask in VARIANTS:
            if afresh:
                sessions._fingerprints.clear()
            again = copy.deepcopy(request)  # new objects, as the next request's parse makes
            found.append(
                sessions.fingerprint(again, mask, with_user=with_user, with_system=with_system)
            )
    return found


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(conversations(), st.none() | TOOLS), min_size=1, max_size=6))
def test_kept_fingerprints_are_worked_out_afresh(heads: list[tuple[list[Any], Any]]) -> None:
    requests = [
        {"messages": messages, **({"tools": tools} if tools is not None else {})}
        for messages, tools in heads
    ]
    expected = keys(requests, afresh=True)
    assert keys(requests, afresh=False) == expected
    assert keys(requests, afresh=False) == expected  # every one kept by now
