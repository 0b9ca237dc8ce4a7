"""SSE splitting must give the same events whatever the chunking of the byte stream."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from proxy.sse import EventSplitter, event_data

STREAM = (
    b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
    b'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\n'
    b": keep-alive comment\n\n"
    b'data: {"choices":[{"delta":{"content":"lo\\n\\nworld"}}]}\n\n'
    b"event: message\ndata: line one\ndata: line two\n\n"
    b"data: [DONE]\n\n"
)


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *cuts})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def feed_all(chunks: list[bytes]) -> list[bytes]:
    splitter = EventSplitter()
    events = [event for chunk in chunks for event in splitter.feed(chunk)]
    rest = splitter.flush()
    return events + ([rest] if rest else [])


def test_whole_stream_gives_each_event_unchanged() -> None:
    events = feed_all([STREAM])
    assert len(events) == 6
    assert b"".join(events) == STREAM


def test_every_single_split_point_gives_the_same_events() -> None:
    expected = feed_all([STREAM])
    for cut in range(len(STREAM) + 1):
        assert feed_all(split_at(STREAM, [cut])) == expected, cut


def test_byte_by_byte() -> None:
    assert feed_all([bytes([b]) for b in STREAM]) == feed_all([STREAM])


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=20))
def test_any_chunking_gives_the_same_events(cuts: list[int]) -> None:
    assert feed_all(split_at(STREAM, cuts)) == feed_all([STREAM])


@given(
    st.sampled_from([b"\n", b"\r\n", b"\r"]),
    st.lists(st.integers(min_value=0, max_value=200), max_size=8),
)
def test_all_line_endings(newline: bytes, cuts: list[int]) -> None:
    stream = b"".join(b"data: " + str(i).encode() + newline + newline for i in range(5))
    events = feed_all(split_at(stream, cuts))
    assert [event_data(e) for e in events] == [str(i).encode() for i in range(5)]
    assert b"".join(events) == stream


def test_unterminated_last_event_is_flushed() -> None:
    splitter = EventSplitter()
    assert splitter.feed(b"data: 1\n\ndata: 2") == [b"data: 1\n\n"]
    assert splitter.flush() == b"data: 2"
    assert splitter.flush() == b""


def test_event_data() -> None:
    assert event_data(b"data: {}\n\n") == b"{}"
    assert event_data(b"data:{}\n\n") == b"{}"
    assert event_data(b"event: x\ndata: a\ndata: b\n\n") == b"a\nb"
    assert event_data(b": comment\n\n") is None
    assert event_data(b"data: x\r\n\r\n") == b"x"
