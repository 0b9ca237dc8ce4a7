"""The C-speed scans over a history (proxy.transcript.with_role, matched_messages) give
what a plain Python loop over the messages gives, whatever the messages hold."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from proxy.batching import steps_in_turn
from proxy.transcript import matched_messages, with_role

ROLES = ["system", "developer", "user", "assistant", "tool", "other"]
role_values = st.one_of(
    st.sampled_from(ROLES), st.none(), st.integers(), st.lists(st.text(max_size=3), max_size=2)
)
message = st.one_of(
    st.fixed_dictionaries({"role": role_values, "content": st.text(max_size=3)}),
    st.fixed_dictionaries({"content": st.text(max_size=3)}),  # no role
    st.text(max_size=3),  # not an object
    st.none(),
)
role_sets = st.frozensets(st.sampled_from(ROLES), max_size=3)


def role_of(item: Any) -> Any:
    return item.get("role") if isinstance(item, dict) else None


@given(st.lists(message, max_size=30), role_sets)
def test_with_role_is_the_loop_it_replaces(messages: list[Any], roles: frozenset[str]) -> None:
    expected = [
        i for i, m in enumerate(messages) if isinstance(role_of(m), str) and role_of(m) in roles
    ]
    assert with_role(messages, roles) == expected


@given(st.lists(st.fixed_dictionaries({"role": st.sampled_from(ROLES)}), max_size=30), role_sets)
def test_with_role_on_well_formed_messages(messages: list[Any], roles: frozenset[str]) -> None:
    assert with_role(messages, roles) == [i for i, m in enumerate(messages) if m["role"] in roles]


@given(st.lists(message, max_size=30))
def test_steps_in_turn_counts_assistants_after_the_last_user(messages: list[Any]) -> None:
    steps = 1
    for item in reversed(messages):
        if role_of(item) == "user":
            break
        if role_of(item) == "assistant":
            steps += 1
    assert steps_in_turn(messages) == steps


@given(st.lists(st.binary(max_size=2), max_size=20), st.lists(st.binary(max_size=2), max_size=20))
def test_matched_messages_is_the_common_prefix(chain: list[bytes], before: list[bytes]) -> None:
    matched = 0
    for now, then in zip(chain, before, strict=False):
        if now != then:
            break
        matched += 1
    assert matched_messages(chain, before) == matched
