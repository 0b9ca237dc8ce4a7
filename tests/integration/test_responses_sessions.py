"""Responses API sessions in process: ``previous_response_id`` chains stay on the engine
that stored the response, and a conversation id or the session header name the session."""

from __future__ import annotations

import itertools
import json
from typing import Any

import httpx
import pytest

from proxy.responses.items import SOURCE

pytestmark = pytest.mark.anyio

ROUTE = "/v1/responses"


class StoringEngines:
    """Engines that store their responses (vLLM with VLLM_ENABLE_RESPONSES_API_STORE=1):
    each knows only its own, and answers an unknown previous_response_id 404 as vLLM does."""

    def __init__(self, *, reasoning: bool = False) -> None:
        self.reasoning = reasoning
        self.stored: dict[str, set[str]] = {}
        self.served: list[tuple[str, dict[str, Any]]] = []
        self._ids = itertools.count()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.method != "POST" or request.url.path != ROUTE:
            return httpx.Response(200, json={})
        host, body = request.url.host, json.loads(request.content)
        self.served.append((host, body))
        stored = self.stored.setdefault(host, set())
        previous = body.get("previous_response_id")
        if previous is not None and previous not in stored:
            error = {
                "error": {
                    "message": f"Response with id '{previous}' not found.",
                    "type": "invalid_request_error",
                    "param": "response_id",
                    "code": 404,
                }
            }
            return httpx.Response(404, json=error)
        response_id = f"resp_{next(self._ids)}"
        stored.add(response_id)
        call = {
            "type": "function_call",
            "id": f"fc_{response_id}",
            "call_id": f"call_{response_id}",
            "name": "lookup",
            "arguments": '{"q":1}',
            "status": "completed",
        }
        response = {
            "id": response_id,
            "object": "response",
            "status": "completed",
            "output": [self._reasoning(response_id), call] if self.reasoning else [call],
            "usage": {
                "input_tokens": 10,
                "output_tokens": 3,
                "input_tokens_details": {"cached_tokens": 0},
            },
        }
        return httpx.Response(200, json=response)

    def _reasoning(self, response_id: str) -> dict[str, Any]:
        text = {"type": "reasoning_text", "text": "The user wants a lookup."}
        return {"type": "reasoning", "id": f"rs_{response_id}", "summary": [], "content": [text]}


async def test_chained_requests_reach_the_engine_that_stored_the_response(make_proxy) -> None:
    engines = StoringEngines()
    proxy = make_proxy(engines, upstream="http://e1:8000,http://e2:8000,http://e3:8000")
    firsts = []
    for name in ("billing", "travel", "weather", "support", "search", "coding"):
        body = {"model": "m", "instructions": f"The {name} agent.", "input": "go", "store": True}
        answer = await proxy.client.post(ROUTE, json=body)
        assert answer.status_code == 200
        firsts.append(answer.json())
    assert len({host for host, _ in engines.served}) > 1  # the conversations were spread
    for first in firsts:
        call = first["output"][0]
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
        body = {"model": "m", "previous_response_id": first["id"], "input": [output]}
        answer = await proxy.client.post(ROUTE, json=body)
        assert answer.status_code == 200, answer.text
        # What went upstream is the client's request: nothing folded, restored or added.
        assert engines.served[-1][1]["input"] == [output]
    assert proxy.sample("prefill_proxy_prefix_breaks_total", reason="engine_history") == 6


async def test_an_unknown_previous_response_is_the_engines_error(make_proxy) -> None:
    engines = StoringEngines()
    proxy = make_proxy(engines)
    body = {"model": "m", "previous_response_id": "resp_none", "input": "and then?"}
    answer = await proxy.client.post(ROUTE, json=body)
    assert answer.status_code == 404
    assert answer.json()["error"]["message"] == "Response with id 'resp_none' not found."


async def test_conversation_and_header_name_the_session(make_proxy) -> None:
    """Two requests of one conversation id share history: the second's call, re-sent
    re-serialized, goes upstream as the engine emitted it."""
    engines = StoringEngines()
    proxy = make_proxy(engines)
    for named in ({"conversation": {"id": "conv_1"}}, {"conversation": "conv_2"}, {}):
        headers = {} if named else {"x-session-id": "s-1"}
        user = {"role": "user", "content": "go"}
        body = {"model": "m", "input": [user], **named}
        first = (await proxy.client.post(ROUTE, json=body, headers=headers)).json()
        emitted = first["output"][0]
        resent = {k: emitted[k] for k in ("type", "call_id", "name")} | {"arguments": '{"q": 1}'}
        output = {"type": "function_call_output", "call_id": emitted["call_id"], "output": "ok"}
        body = {"model": "m", "input": [user, resent, output], **named}
        answer = await proxy.client.post(ROUTE, json=body, headers=headers)
        assert answer.status_code == 200
        forwarded = engines.served[-1][1]["input"]
        assert forwarded[1] == emitted
        assert all(SOURCE not in item for item in forwarded)


async def test_reasoning_the_client_dropped_goes_back_as_emitted(make_proxy) -> None:
    engines = StoringEngines(reasoning=True)
    proxy = make_proxy(engines)
    user = {"role": "user", "content": "look it up"}
    first = (await proxy.client.post(ROUTE, json={"model": "m", "input": [user]})).json()
    reasoning, call = first["output"]
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}
    body = {"model": "m", "input": [user, call, output]}  # the reasoning item left out
    assert (await proxy.client.post(ROUTE, json=body)).status_code == 200
    assert engines.served[-1][1]["input"] == [user, reasoning, call, output]
    assert proxy.sample("prefill_proxy_prefix_breaks_total", reason="none") == 1
