"""Session fingerprints kept by their head (proxy.sessions) are the fingerprints worked
out afresh, for every variant and mask."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import jsonio
from proxy.rewrite.volatile import DEFAULT_DETECTOR
from proxy.sessions import fingerprint
from tests.support.conversations import conversations

TOOLS = st.lists(
    st.fixed_dictionaries({"type": st.just("function"), "name": st.sampled_from("abc")}),
    max_size=3,
)


def afresh(request: dict[str, Any], mask: Any, with_user: bool, with_system: bool) -> str:
    """The fingerprint as it was before it was kept: the head encoded every time."""
    head: list[Any] = []
    for message in request["messages"]:
        if not isinstance(message, dict):
            continue
        role, content = message.get("role"), message.get("content")
        if role in ("system", "developer"):
            if with_system:
                head.append([role, mask(content) if isinstance(content, str) else content])
        elif role == "user":
            if with_user:
                head.append(["user", content])
            break
    tools = request.get("tools")
    if isinstance(tools, list):
        named = [t for t in tools if isinstance(t, dict)]
        head.append(sorted(jsonio.dumps_canonical(t).decode() for t in named))
    return hashlib.blake2b(jsonio.dumps_canonical(head), digest_size=12).hexdigest()


@settings(max_examples=200, deadline=None)
@given(conversations(), st.none() | TOOLS, st.booleans(), st.booleans(), st.booleans())
def test_kept_fingerprints_are_worked_out_afresh(
    messages: list[Any], tools: Any, with_user: bool, with_system: bool, masked: bool
) -> None:
    request = {"messages": messages, **({"tools": tools} if tools is not None else {})}
    mask = DEFAULT_DETECTOR.key if masked else str
    expected = afresh(request, mask, with_user, with_system)
    for _ in range(2):  # worked out, then kept
        again = copy.deepcopy(request)
        assert fingerprint(again, mask, with_user=with_user, with_system=with_system) == expected
