"""The whole session path with the spliced encode (proxy.splice) forwards what it forwards
without it: the dev traces, replayed as clients that write JSON in different ways and
change their history in different ways (proxy.replay.profiles), reach the upstream as the
same requests (equal as JSON, types included) whether the untouched messages go as the
client's bytes or are encoded again; and as the same bytes whether each body was parsed
whole or as the continuation of the conversation's previous one (proxy.bodies)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from proxy import bodies, jsonio, splice
from proxy.replay import traces
from proxy.replay.profiles import Prompt, faithful, mixed, varied_clocks
from proxy.replay.request import REPLY_FIELD, as_responses
from tests.support.fake_upstream import USAGE

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
STYLES = ({"indent": 1, "ensure_ascii": True}, {"separators": (",", ":"), "ensure_ascii": False})


async def replay(
    make_proxy, monkeypatch, min_bytes: int, profile, style, **overrides: Any
) -> tuple[list[bytes], Any]:
    monkeypatch.setattr(splice, "MIN_BYTES", min_bytes)
    reply: dict[str, Any] = {}

    def answer(request: httpx.Request) -> httpx.Response:
        body = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "m",
            "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}],
            "usage": USAGE,
        }
        return httpx.Response(200, json=body)

    def write(request: dict[str, Any], step: traces.Step) -> bytes:
        reply.clear()
        reply.update(step.reply)
        return json.dumps(request, **style).encode()

    proxy = make_proxy(answer, warmup=False, **overrides)
    return await drive(proxy, profile, CHAT, write), proxy


async def drive(proxy, profile, route: str, write) -> list[bytes]:
    """The first dev conversations step by step through ``proxy``, as ``profile``'s client
    changes them: each step's chat request written by ``write(request, step)`` and posted
    to ``route``. The bodies the upstream got."""
    for conversation in traces.load(traces.locate("dev"), limit=4):
        for index, step in enumerate(traces.steps(conversation)):
            prompt = profile(Prompt(step.messages, conversation.tools), conversation.id, index)
            request = {"model": "m", "messages": prompt.messages, "tools": prompt.tools}
            response = await proxy.client.post(route, content=write(request, step))
            assert response.status_code == 200
    return [r.content for r in proxy.seen if r.method == "POST" and r.url.path == route]


@pytest.mark.parametrize("profile", [faithful, mixed, varied_clocks])
@pytest.mark.parametrize("style", STYLES)
async def test_sessions_forward_the_same_requests_spliced_or_not(
    make_proxy, monkeypatch, profile, style
) -> None:
    spliced, _ = await replay(make_proxy, monkeypatch, 0, profile, style, body_cache_bytes=0)
    whole, _ = await replay(make_proxy, monkeypatch, 1 << 40, profile, style, body_cache_bytes=0)
    assert len(spliced) == len(whole) > 30
    canonical = [jsonio.dumps_canonical(jsonio.loads(body)) for body in spliced]
    assert canonical == [jsonio.dumps_canonical(jsonio.loads(body)) for body in whole]
    # The shortcut was taken: rewritten requests carry messages as the client wrote them.
    if style.get("indent"):
        assert sum(b'\n   "role"' in body for body in spliced) > len(spliced) // 2
        assert not any(b'\n   "role"' in body for body in whole)


@pytest.mark.parametrize("profile", [faithful, mixed, varied_clocks])
@pytest.mark.parametrize("style", STYLES)
async def test_sessions_forward_the_same_bytes_with_bodies_continued_or_parsed_whole(
    make_proxy, monkeypatch, profile, style
) -> None:
    monkeypatch.setattr(bodies, "MIN_BODY", 0)  # every body kept, however small
    continued, proxy = await replay(make_proxy, monkeypatch, 0, profile, style)
    whole, _ = await replay(make_proxy, monkeypatch, 0, profile, style, body_cache_bytes=0)
    assert len(continued) == len(whole) > 30
    assert continued == whole
    parses = proxy.sample("prefill_proxy_body_parses_total", outcome="continued")
    # Clients that keep their history byte for byte: every step after a conversation's
    # first continues the previous body.
    print(getattr(profile, "__name__", "varied"), parses, len(continued))
    if profile is faithful:
        assert parses == len(continued) - 4


async def replay_responses(make_proxy, profile, **overrides: Any) -> tuple[list[bytes], Any]:
    """The same conversations as Responses API requests (proxy.replay.request.as_responses:
    the system prompt as instructions, the rest as input items)."""

    def answer(request: httpx.Request) -> httpx.Response:
        output = [
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [{"type": "output_text", "text": "ok", "annotations": []}],
            }
        ]
        usage = {"input_tokens": 40, "output_tokens": 1, "total_tokens": 41}
        body = {
            "id": "resp_1",
            "object": "response",
            "status": "completed",
            "model": "m",
            "output": output,
            "usage": usage,
        }
        return httpx.Response(200, json=body)

    def write(chat: dict[str, Any], step: traces.Step) -> bytes:
        request = {**as_responses(chat), "stream": False}
        request.pop(REPLY_FIELD, None)
        return json.dumps(request).encode()

    proxy = make_proxy(answer, warmup=False, **overrides)
    return await drive(proxy, profile, RESPONSES, write), proxy


@pytest.mark.parametrize("profile", [faithful, mixed])
async def test_responses_sessions_forward_the_same_bytes_with_bodies_continued_or_not(
    make_proxy, monkeypatch, profile
) -> None:
    monkeypatch.setattr(bodies, "MIN_BODY", 0)
    continued, proxy = await replay_responses(make_proxy, profile)
    whole, _ = await replay_responses(make_proxy, profile, body_cache_bytes=0)
    assert len(continued) == len(whole) > 30
    assert continued == whole
    parses = proxy.sample("prefill_proxy_body_parses_total", outcome="continued")
    if profile is faithful:  # every step after a conversation's first
        assert parses == len(continued) - 4
