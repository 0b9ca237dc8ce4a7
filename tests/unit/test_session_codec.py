"""Session records as bytes and back (proxy.session_codec): every field, any content."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from proxy import jsonio, session_codec
from proxy.compaction.state import Compaction
from proxy.sessions import Pace, Session

keys = st.binary(min_size=1, max_size=16)
text = st.text(max_size=20)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)
message = st.fixed_dictionaries({"role": st.sampled_from(["assistant", "user", "tool"])}).map(
    lambda m: {**m, "content": "x"}
) | st.dictionaries(text, json_value, max_size=3)
compactions = st.builds(
    Compaction,
    cut_key=st.none() | keys,
    cut_hint=st.integers(0, 100),
    stand_in=st.none() | message,
    summary=st.none() | text,
    facts=st.lists(text, max_size=3),
    elided=st.dictionaries(keys, st.tuples(message, st.integers(0, 1000)), max_size=3),
    events=st.integers(0, 9),
    unreported=st.sampled_from(["", "summary", "elide"]),
    sizes=st.dictionaries(keys, st.integers(0, 5000), max_size=4),
    ratio=st.floats(0.5, 3.0),
    last_estimate=st.integers(0, 10**6),
    last_used=st.integers(0, 10**6),
)
sessions = st.builds(
    Session,
    key=text,
    substitutions=st.dictionaries(keys, message, max_size=4),
    pinned_template_kwargs=st.dictionaries(text, json_value, max_size=3),
    last_note_lines=st.lists(text, max_size=3).map(tuple),
    note_carriers=st.lists(keys, max_size=3).map(tuple),
    system_digest=st.binary(max_size=16),
    system_lines=st.lists(st.binary(min_size=24, max_size=24), max_size=4).map(tuple),
    learned=st.dictionaries(st.binary(min_size=8, max_size=8), st.integers(0, 20), max_size=3),
    last_chain=st.lists(keys, max_size=4).map(tuple),
    last_tools=st.binary(max_size=8),
    last_prompt_tokens=st.integers(0, 10**6),
    last_completion_tokens=st.integers(0, 10**6),
    last_reply_tool_calls=st.integers(0, 12),
    warmed=st.booleans(),
    warmed_tokens=st.integers(0, 1 << 20),
    pace=st.builds(Pace, st.none() | st.floats(0, 1e9), st.lists(st.floats(0, 60), max_size=4)),
    compaction=st.none() | compactions,
    summary_failed_at=st.none() | st.floats(0, 2e9),
    engine=text,
    router_token=text,
    version=st.integers(0, 10**6),
)


@given(sessions)
def test_a_record_survives_the_round_trip(session: Session) -> None:
    back = session_codec.decode(session_codec.encode(session))
    assert back == dataclasses.replace(session, touched=0.0)  # touched is the store's own
    assert list(back.substitutions) == list(session.substitutions)  # order is LRU order


def test_every_field_is_encoded() -> None:
    """A field added to the record but not to the codec would vanish in a shared store."""
    encoded = session_codec.encode(Session("s", compaction=Compaction()))
    raw = jsonio.loads(encoded)
    assert {f.name for f in dataclasses.fields(Session)} - {"touched"} <= set(raw)
    assert {f.name for f in dataclasses.fields(Compaction)} == set(raw["compaction"])


def test_bytes_of_another_format_are_refused() -> None:
    for data in (b"{}", b"[1]", b"not json", b'{"format": 999}'):
        try:
            session_codec.decode(data)
        except session_codec.CodecError:
            continue
        raise AssertionError(f"decoded {data!r}")
