"""Tool forms kept by the plain encoding (proxy.tool_forms) are the forms worked out
afresh: a kept entry is never another list's."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import jsonio, tool_forms

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-2, 2) | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)


def afresh(tools: Any) -> tool_forms.ToolForms:
    digest = hashlib.blake2b(jsonio.dumps_canonical(tools), digest_size=16).digest()
    named: tuple[str, ...] = ()
    if isinstance(tools, list):
        named = tuple(
            sorted(jsonio.dumps_canonical(t).decode() for t in tools if isinstance(t, dict))
        )
    return tool_forms.ToolForms(digest, named)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(json_values, max_size=4) | json_values, min_size=1, max_size=6))
def test_kept_forms_are_the_forms_worked_out_afresh(lists: list[Any]) -> None:
    for tools in lists + [copy.deepcopy(tools) for tools in lists]:
        assert tool_forms.forms(tools) == afresh(tools)
        assert tool_forms.forms(tools) == afresh(tools)  # the same object asked again
        assert tool_forms.forms(tools).encoded == jsonio.dumps(tools)


def test_key_order_aside_the_same_tools_have_the_same_digest() -> None:
    one = [{"type": "function", "function": {"name": "a", "parameters": {}}}]
    other = [{"function": {"parameters": {}, "name": "a"}, "type": "function"}]
    assert tool_forms.forms(one) == tool_forms.forms(other)
    assert tool_forms.forms(one).digest != tool_forms.forms([True]).digest
    assert tool_forms.forms([1]) != tool_forms.forms([True]) != tool_forms.forms([1.0])


def test_only_the_most_recent_lists_are_kept() -> None:
    for n in range(tool_forms.KEPT + 50):
        tool_forms.forms([{"name": f"t{n}"}])
    assert len(tool_forms._kept) == tool_forms.KEPT
