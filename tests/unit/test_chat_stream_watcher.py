"""The stream watcher: usage chunk stripped only when the proxy asked for it, every other
byte forwarded unchanged, whatever the chunking; token timing and usage captured."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from proxy.exchange import Exchange
from proxy.relay import ChatStreamWatcher, relay_chunks
from tests.support.fake_upstream import USAGE, WORDS, stream_events
from tests.unit.test_sse import split_at

WITH_USAGE = stream_events(include_usage=True)
STREAM = b"".join(WITH_USAGE)
# What the client would have had straight from the engine, without asking for usage.
WITHOUT_USAGE = b"".join(stream_events(include_usage=False))


def relay(chunks: list[bytes], *, strip_usage: bool) -> tuple[bytes, Exchange]:
    exchange = Exchange("/v1/chat/completions", "POST", started=0.0)
    watcher = ChatStreamWatcher(exchange, strip_usage=strip_usage)
    out = b"".join(watcher.relay(chunk, float(i + 1)) for i, chunk in enumerate(chunks))
    return out + watcher.flush(), exchange


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_stream_is_what_the_client_gets_without_usage(cuts: list[int]) -> None:
    out, exchange = relay(split_at(STREAM, cuts), strip_usage=True)
    assert out == WITHOUT_USAGE
    assert exchange.usage == USAGE


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_client_that_asked_for_usage_gets_the_stream_unchanged(cuts: list[int]) -> None:
    out, exchange = relay(split_at(STREAM, cuts), strip_usage=False)
    assert out == STREAM
    assert exchange.usage == USAGE


def test_token_times_skip_the_role_chunk_and_the_finish_chunk() -> None:
    _, exchange = relay(WITH_USAGE, strip_usage=True)
    # events: role (t=1), 3 tokens (t=2,3,4), finish (t=5), usage, [DONE]
    assert exchange.first_token_at == 2.0
    assert exchange.last_token_at == 4.0
    assert exchange.token_gaps == [1.0, 1.0]


def test_tool_call_and_reasoning_deltas_count_as_tokens() -> None:
    events = [
        b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0}]}}]}\n\n',
    ]
    _, exchange = relay(events, strip_usage=True)
    assert (exchange.first_token_at, exchange.last_token_at) == (1.0, 2.0)


def test_error_event_is_forwarded_and_noted() -> None:
    event = b'data: {"error":{"message":"boom","type":"x","code":500}}\n\n'
    exchange = Exchange("/v1/chat/completions", "POST")
    watcher = ChatStreamWatcher(exchange, strip_usage=True)
    assert watcher.relay(event, 1.0) == event
    assert watcher.error["message"] == "boom"


def test_held_terminal_chunk_is_released_unchanged_without_a_usage_chunk() -> None:
    terminal = stream_events(include_usage=True)[-3]
    out, _ = relay([terminal], strip_usage=True)
    assert out == terminal
    out, _ = relay([terminal, b"data: [DONE]\n\n"], strip_usage=True)
    assert out == terminal + b"data: [DONE]\n\n"


def test_non_json_and_comment_events_pass_through() -> None:
    events = b": ping\n\ndata: not json\n\ndata: [DONE]\n\n"
    out, exchange = relay([events], strip_usage=True)
    assert out == events
    assert exchange.first_token_at is None


def test_the_reply_is_handed_over_before_done_is_relayed() -> None:
    """Clients send their next request the moment they see [DONE]: the session must
    already hold this reply by then (the handover is awaited: a shared store's save)."""
    seen: list[Any] = []
    exchange = Exchange("/v1/chat/completions", "POST")

    async def on_reply() -> None:
        await asyncio.sleep(0)  # a save that waits on the store
        seen.append(("reply", exchange.reply))

    class Body:
        async def iter_bytes(self) -> AsyncIterator[bytes]:
            *body, done = WITH_USAGE
            yield b"".join(body)
            yield done

    async def relayed() -> None:
        watcher = ChatStreamWatcher(exchange, strip_usage=True, on_reply=on_reply)
        async for chunk in relay_chunks(Body(), exchange, watcher):  # type: ignore[arg-type]
            seen.append(("chunk", chunk))

    asyncio.run(relayed())
    kinds = [kind for kind, _ in seen]
    assert kinds[-2:] == ["reply", "chunk"] and seen[-1][1].endswith(b"data: [DONE]\n\n")
    assert kinds.count("reply") == 1
    assert exchange.reply == {"role": "assistant", "content": "".join(WORDS)}
