"""The overhead benchmark's upstream reads a request's stream flags off its bytes
(tests/support/fake_upstream.scanned_flags): it must read what parsing reads, for the
bodies the benchmark sends and for those bodies as the proxy forwards them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.benchmarks.overhead import AgentSessions, request_body
from tests.support.fake_upstream import scanned_flags


def parsed_flags(body: bytes) -> dict[str, Any]:
    payload = json.loads(body)
    usage = bool((payload.get("stream_options") or {}).get("include_usage"))
    stream = bool(payload.get("stream"))
    return {"stream": stream, "stream_options": {"include_usage": stream and usage}}


def bodies(stream: bool) -> list[bytes]:
    found = [request_body(stream)]
    for replies_back in ("", "exact", "sdk"):
        sessions = AgentSessions(16 * 1024, stream, 600, per_session=3, replies_back=replies_back)
        found += [sessions.body(1, number) for number in range(3)]
    return found


@pytest.mark.parametrize("stream", [True, False])
def test_the_benchmarks_bodies_read_as_parsed(stream: bool) -> None:
    for body in bodies(stream):
        assert scanned_flags(body) == parsed_flags(body)
        # As the proxy forwards a stream: usage asked for, after the messages, in either
        # spacing of the encoders it uses.
        for usage in (
            b',"stream_options":{"include_usage":true}}',
            b', "stream_options": {"include_usage": true}}',
        ):
            forwarded = body[:-1] + usage
            assert scanned_flags(forwarded) == parsed_flags(forwarded)


def test_a_key_of_the_same_name_that_holds_no_boolean_is_passed_over() -> None:
    body = json.dumps(
        {
            "tools": [{"parameters": {"properties": {"stream": {"type": "boolean"}}}}],
            "messages": [{"role": "tool", "content": json.dumps({"stream": False})}],
            "stream": True,
        }
    ).encode()
    assert scanned_flags(body) == {"stream": True, "stream_options": {"include_usage": False}}
    assert scanned_flags(b"{}") == parsed_flags(b"{}")
