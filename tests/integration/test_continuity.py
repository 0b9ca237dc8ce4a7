"""How a request continues its session, judged while the engine reads it (or before its
record, where the engine answered first): always against the session's previous step,
never against the request's own record."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.fake_upstream import completion_body, stream_events

pytestmark = pytest.mark.anyio

ROUTE = "/v1/chat/completions"
SYSTEM = {"role": "system", "content": "You help with flights."}
USER = {"role": "user", "content": "change my flight"}
COMPLETION_TOKENS = 3  # tests.support.fake_upstream.USAGE


def by_length(request: httpx.Request) -> httpx.Response:
    """A completion whose prompt_tokens grow with the request: each step's usage differs,
    so the cached tokens expected tell which step a request was judged against."""
    body = json.loads(request.content)
    prompt = 100 * len(body["messages"])
    if body.get("stream"):
        events = b"".join(stream_events(True, prompt))
        return httpx.Response(200, content=events, headers={"content-type": "text/event-stream"})
    return httpx.Response(
        200, content=completion_body(prompt), headers={"content-type": "application/json"}
    )


def step(history: list[dict], number: int) -> list[dict]:
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call_{number}",
                "type": "function",
                "function": {"name": "lookup", "arguments": json.dumps({"q": number})},
            }
        ],
    }
    result = {"role": "tool", "tool_call_id": f"call_{number}", "content": "ok"}
    return [*history, call, result]


def expected_cached(proxy) -> float:
    return proxy.sample("prefill_proxy_expected_cached_prompt_tokens_total", route=ROUTE, model="m")


@pytest.mark.parametrize("stream", [False, True])
async def test_each_step_is_judged_against_the_previous_one(make_proxy, stream: bool) -> None:
    proxy = make_proxy(by_length)
    headers = {"x-session-id": "s-1"}
    messages = [SYSTEM, USER]
    answered = []
    for number in range(3):
        body = {"model": "m", "messages": messages, "stream": stream}
        answer = await proxy.client.post(ROUTE, json=body, headers=headers)
        assert answer.status_code == 200
        answered.append(len(proxy.upstream_json()["messages"]))
        messages = step(messages, number)
    assert proxy.sample("prefill_proxy_prefix_breaks_total", reason="new_session") == 1
    # The client sends its own calls, not the replies: the history differs after the user.
    assert proxy.sample("prefill_proxy_prefix_breaks_total", reason="history_rewritten") == 2
    # Share of the previous prompt and reply up to where it differs: 2 of 3 messages, then
    # 4 of 5 (a request judged against its own record would expect its own prompt).
    first, second = (100 * n + COMPLETION_TOKENS for n in answered[:2])
    assert expected_cached(proxy) == int(first * 2 / 3) + int(second * 4 / 5)


async def test_a_request_the_engine_refused_is_judged_too(make_proxy) -> None:
    refusing = False

    def engine(request: httpx.Request) -> httpx.Response:
        if refusing:
            return httpx.Response(503, json={"error": {"message": "overloaded"}})
        return by_length(request)

    proxy = make_proxy(engine)
    headers = {"x-session-id": "s-2"}
    body = {"model": "m", "messages": [SYSTEM, USER]}
    assert (await proxy.client.post(ROUTE, json=body, headers=headers)).status_code == 200
    refusing = True
    body = {"model": "m", "messages": [SYSTEM, USER, {"role": "user", "content": "and?"}]}
    assert (await proxy.client.post(ROUTE, json=body, headers=headers)).status_code == 503
    assert proxy.sample("prefill_proxy_prefix_breaks_total", reason="history_rewritten") == 1
