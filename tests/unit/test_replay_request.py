"""The body of one replayed step, and reading its streamed answer."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from proxy.replay import profiles, request, traces
from proxy.replay.response import StreamObserver, token_counts
from tests.support.fake_upstream import USAGE, chunk, stream_events
from tests.unit.test_replay_traces import DEV
from tests.unit.test_sse import split_at

TAU2 = next(c for c in traces.load(DEV, limit=60) if c.source.startswith("tau2/"))


def test_body_streams_with_usage_and_carries_the_recorded_answer() -> None:
    step = traces.steps(TAU2)[2]
    body = request.build(step, profiles.faithful, "m")
    assert body["model"] == "m"
    assert body["messages"] == step.messages
    assert body["tools"] == TAU2.tools
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body[request.REPLY_FIELD] == step.reply
    assert body["temperature"] == 0.0 and body["tool_choice"] == "auto"
    assert body["seed"] == TAU2.request["seed"]
    assert "max_tokens" not in body
    assert request.build(step, profiles.faithful, "m", max_tokens=7)["max_tokens"] == 7


def test_the_engine_answer_stays_the_recorded_one_whatever_the_profile() -> None:
    step = next(s for s in traces.steps(TAU2) if s.reply.get("tool_calls"))
    body = request.build(step, profiles.mixed, "m")
    assert body[request.REPLY_FIELD] is step.reply


def test_sampling_drops_unset_values_and_what_breaks_vllm() -> None:
    recorded = {
        "temperature": 0.2,
        "tool_choice": None,
        "parallel_tool_calls": False,
        "top_p": 0.9,
        "stream": False,
        "model": "gpt-4o",
    }
    assert request.sampling(recorded, has_tools=True) == {"temperature": 0.2, "top_p": 0.9}
    assert request.sampling({"parallel_tool_calls": True}, has_tools=True) == {
        "parallel_tool_calls": True
    }
    assert request.sampling({"tool_choice": "auto"}, has_tools=False) == {}


def test_body_is_json() -> None:
    for step in traces.steps(TAU2):
        json.dumps(request.build(step, profiles.mixed, "m"))


STREAM = b"".join(stream_events(include_usage=True))


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_first_token_and_usage_whatever_the_chunking(cuts: list[int]) -> None:
    observer = StreamObserver()
    chunks = split_at(STREAM, cuts)
    first_with_token = None
    seen = b""
    for i, piece in enumerate(chunks):
        seen += piece
        observer.feed(piece, float(i))
        # The first event with content ("Hello") is whole once its blank line arrived.
        end = STREAM.index(b'"Hello"')
        if first_with_token is None and len(seen) >= STREAM.index(b"\n\n", end) + 2:
            first_with_token = float(i)
    observer.close(99.0)
    assert observer.first_token_at == first_with_token
    assert observer.usage == USAGE
    assert observer.error is None
    assert token_counts(observer.usage) == (40, 32)


def test_role_only_chunk_is_not_a_token_but_tool_calls_and_reasoning_are() -> None:
    for delta, is_token in [
        ({"role": "assistant", "content": ""}, False),
        ({"tool_calls": [{"index": 0, "id": "c"}]}, True),
        ({"reasoning_content": "hm"}, True),
        ({"reasoning": "hm"}, True),
    ]:
        observer = StreamObserver()
        observer.feed(chunk(delta), 1.0)
        assert (observer.first_token_at == 1.0) is is_token


def test_error_event_is_recorded() -> None:
    observer = StreamObserver()
    observer.feed(chunk({"content": "a"}), 1.0)
    observer.feed(b'data: {"error": {"message": "engine died", "code": 500}}\n\n', 2.0)
    observer.feed(b"data: [DONE]\n\n", 3.0)
    assert observer.error == "engine died"


def test_usage_without_cached_tokens() -> None:
    assert token_counts({"prompt_tokens": 5}) == (5, None)
    assert token_counts({"prompt_tokens": 5, "prompt_tokens_details": None}) == (5, None)
    assert token_counts(None) == (None, None)
