"""Canonical tools: one order and one serialization for the same set of tools, meaning
unchanged, already-canonical requests and malformed ones left exactly as they are."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import jsonio
from proxy.replay import profiles, traces
from proxy.replay.profiles import Prompt
from proxy.rewrite import RewriteContext
from proxy.rewrite.canonical_tools import canonical_tools
from tests.support.conversations import any_conversations, conversations, is_valid_conversation
from tests.unit.test_replay_traces import DEV

CONTEXT = RewriteContext()
CONVERSATIONS = traces.load(DEV)


def tool(name: str, **parameters) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def canonical(tools):
    out = canonical_tools({"model": "m", "tools": tools}, CONTEXT)
    return None if out is None else out["tools"]


def test_tools_sorted_by_name_keys_sorted_lists_kept() -> None:
    schema = {
        "type": "object",
        "required": ["b", "a"],
        "properties": {
            "b": {"type": "string", "enum": ["z", "a"], "description": "B"},
            "a": {"type": "integer"},
        },
    }
    tools = [
        {"function": {"parameters": schema, "name": "search"}, "type": "function"},
        {"type": "function", "function": {"name": "book", "description": "Book it."}},
    ]
    out = canonical(tools)
    assert json.dumps(out) == json.dumps(
        [
            {"function": {"description": "Book it.", "name": "book"}, "type": "function"},
            {
                "function": {
                    "name": "search",
                    "parameters": {
                        # property names keep the client's order; each property's schema is sorted
                        "properties": {
                            "b": {"description": "B", "enum": ["z", "a"], "type": "string"},
                            "a": {"type": "integer"},
                        },
                        "required": ["b", "a"],
                        "type": "object",
                    },
                },
                "type": "function",
            },
        ]
    )
    assert canonical(out) is None  # already canonical: forwarded byte for byte
    assert out == [tools[1], tools[0]]  # dict equality: same meaning


def test_unnamed_and_other_tools_come_last_in_a_fixed_order() -> None:
    tools = [{"type": "web_search"}, {"type": "function", "function": {}}, tool("b"), tool("a")]
    for permutation in ([3, 2, 1, 0], [1, 0, 3, 2], [0, 1, 2, 3]):
        out = canonical([tools[k] for k in permutation])
        assert out is not None
        assert [t.get("function", {}).get("name") for t in out][:2] == ["a", "b"]
        assert jsonio.dumps(out) == jsonio.dumps(canonical([tools[k] for k in [3, 2, 1, 0]]))


def test_same_name_ties_are_broken_by_content() -> None:
    one, two = tool("f", type="object"), tool("f", type="string")
    assert jsonio.dumps(canonical([two, one]) or [two, one]) == jsonio.dumps(
        canonical([one, two]) or [one, two]
    )


@pytest.mark.parametrize(
    "request_",
    [
        {"model": "m"},
        {"tools": None},
        {"tools": []},
        {"tools": "search"},
        {"tools": {"b": tool("b"), "a": tool("a")}},
        {"tools": [tool("b"), "a"]},
        {"tools": [tool("b"), None, tool("a")]},
        {"tools": [{"function": {"name": "a"}, "type": "function"}]},  # already canonical
    ],
)
def test_left_alone(request_) -> None:
    assert canonical_tools(request_, CONTEXT) is None


def _reordered(step: traces.Step) -> Prompt:
    prompt = Prompt(step.messages, step.conversation.tools)
    return profiles.reordered_tools(prompt, step.conversation.id, step.index)


@pytest.mark.parametrize("conversation", CONVERSATIONS[:12], ids=lambda c: c.id)
def test_reordered_tools_come_out_byte_identical_across_steps(conversation) -> None:
    faithful = canonical(conversation.tools) or conversation.tools
    sent = set()
    for step in traces.steps(conversation)[:8]:
        tools = _reordered(step).tools
        out = canonical(tools) or tools
        sent.add(jsonio.dumps(out))
        assert out == faithful
    assert sent == {jsonio.dumps(faithful)}


# --- properties --------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
_tool = st.one_of(
    st.builds(
        lambda name, parameters: {
            "type": "function",
            "function": {"name": name, "parameters": parameters},
        },
        st.sampled_from(["a", "b", "c", "search"]),
        st.dictionaries(
            st.sampled_from(["type", "properties", "required", "x"]), _json, max_size=4
        ),
    ),
    st.dictionaries(st.text(max_size=4), _json, max_size=3),
)
_tools = st.one_of(st.lists(_tool, max_size=5), _json, st.lists(_json, max_size=3))


def _bag(tools: list) -> list[str]:
    return sorted(json.dumps(t, sort_keys=True) for t in tools)


@settings(max_examples=300, deadline=None)
@given(_tools, st.randoms(use_true_random=False), any_conversations())
def test_never_raises_never_mutates_deterministic_order_free(tools, random, messages) -> None:
    request = {"model": "m", "messages": messages, "tools": tools}
    before = copy.deepcopy(request)
    out = canonical_tools(request, CONTEXT)
    assert request == before
    assert jsonio.dumps(out) == jsonio.dumps(canonical_tools(request, CONTEXT))
    if out is None:
        return
    assert out["messages"] is messages
    assert canonical_tools(out, CONTEXT) is None
    # The same tools (as JSON values), whatever order they came in.
    assert _bag(out["tools"]) == _bag(tools)
    shuffled = random.sample(tools, len(tools))
    again = canonical_tools({**request, "tools": shuffled}, CONTEXT)
    assert jsonio.dumps((again or {"tools": shuffled})["tools"]) == jsonio.dumps(out["tools"])


@settings(max_examples=100, deadline=None)
@given(st.lists(_tool, max_size=5), conversations())
def test_valid_stays_valid(tools, messages) -> None:
    out = canonical_tools({"messages": messages, "tools": tools}, CONTEXT)
    assert is_valid_conversation((out or {"messages": messages})["messages"])
    if out is not None:
        assert _bag(out["tools"]) == _bag(tools)
