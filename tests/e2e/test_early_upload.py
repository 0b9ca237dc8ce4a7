"""Big requests that continue a conversation start going to the engine before the proxy has
worked on them (early_upload_bytes): the proxy under real uvicorn, the fake upstream on a
socket recording every request it read to the end. Whatever went early, the engine reads
each request once, whole, and byte for byte what a proxy without early uploads forwards;
one that turns out to differ from what was sent early goes again whole."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.fake_upstream import FakeUpstream

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
STEPS = 6
EARLY = 40 << 10  # the tests' threshold: bodies from the second step on are bigger
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_reservation_details",
            "description": "A reservation's flights, seats and fares.",
            "parameters": {"type": "object", "properties": {"id": {"type": "string"}}},
        },
    }
]


def rows(step: int) -> str:
    """A tool result of about 40 KB."""
    return json.dumps(
        [{"flight": f"HAT{step:03d}", "seat": f"{n}A", "fare": n} for n in range(900)]
    )


def chat_bodies(stream: bool, style: dict[str, Any]) -> list[bytes]:
    """A tool loop as a client sends it (each request the last one plus a call and its
    result), in the client's own JSON style; ``messages`` last, as clients write it."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an airline agent. Today is 2026-12-04."},
        {"role": "user", "content": "Change my flight."},
    ]
    requests = []
    for step in range(STEPS):
        request = {"model": "fake", "stream": stream, "tools": TOOLS, "messages": messages}
        requests.append(json.dumps(request, **style).encode())
        call = {"id": f"call_{step}", "type": "function"}
        call["function"] = {"name": "get_reservation_details", "arguments": '{"id": "R1"}'}
        messages = [
            *messages,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{step}", "content": rows(step)},
        ]
    return requests


def responses_bodies() -> list[bytes]:
    """The same loop on the Responses API (``input`` items)."""
    items: list[dict[str, Any]] = [{"role": "user", "content": "Change my flight."}]
    requests = []
    for step in range(STEPS):
        request = {"model": "fake", "stream": True, "instructions": "Be brief.", "input": items}
        requests.append(json.dumps(request).encode())
        items = [
            *items,
            {
                "type": "function_call",
                "call_id": f"call_{step}",
                "name": "get_reservation_details",
                "arguments": '{"id": "R1"}',
            },
            {"type": "function_call_output", "call_id": f"call_{step}", "output": rows(step)},
        ]
    return requests


def drive(
    start_proxy, route: str, bodies: list[bytes], headers_at: dict[int, dict[str, str]], **settings
) -> tuple[list[Any], Any]:
    """Every body through a fresh proxy to a fresh upstream: (what the upstream read, the
    proxy)."""
    with FakeUpstream(max_model_len=1 << 20) as upstream:  # no compaction
        proxy = start_proxy(upstream.url, **settings)
        with httpx.Client(timeout=30) as client:
            for step, body in enumerate(bodies):
                headers = {"content-type": "application/json", **headers_at.get(step, {})}
                response = client.post(proxy.url + route, content=body, headers=headers)
                assert response.status_code == 200, response.text
        return [request for request in upstream.received if request.path == route], proxy


def early(proxy: Any, outcome: str) -> float:
    return proxy.sample("prefill_proxy_early_uploads_total", outcome=outcome)


@pytest.mark.parametrize(
    ("stream", "style"),
    [(False, {}), (True, {"separators": (",", ":")}), (False, {"indent": 2})],
    ids=["non-stream", "stream-compact", "non-stream-indented"],
)
def test_an_agent_session_goes_early_and_reaches_the_engine_as_without(
    start_proxy, stream: bool, style: dict[str, Any]
) -> None:
    bodies = chat_bodies(stream, style)
    assert len(bodies[1]) > EARLY
    plain, _ = drive(start_proxy, CHAT, bodies, {}, early_upload_bytes=0)
    sent, proxy = drive(start_proxy, CHAT, bodies, {}, early_upload_bytes=EARLY)
    assert [request.body for request in sent] == [request.body for request in plain]
    # The first two steps have no kept body to go on from (the first is too small to be
    # kept): from the third on, each request went early and was used.
    chunked = [request.header("transfer-encoding") == "chunked" for request in sent]
    assert chunked == [False, False] + [True] * (STEPS - 2)
    assert early(proxy, "used") == STEPS - 2
    assert early(proxy, "discarded") == 0


def test_a_request_that_differs_from_what_went_early_goes_again_whole(start_proxy) -> None:
    """The client turns the rewrites off for one step: what went early (the history as the
    proxy rewrote it) is not that request's start, so it is dropped before its end and the
    request sent whole; the engine reads each request once."""
    bodies = chat_bodies(False, {})
    changed = {3: {"x-prefill-proxy-rewrite": "off"}}
    plain, _ = drive(start_proxy, CHAT, bodies, changed, early_upload_bytes=0)
    sent, proxy = drive(start_proxy, CHAT, bodies, changed, early_upload_bytes=EARLY)
    assert [request.body for request in sent] == [request.body for request in plain]
    assert sent[3].header("content-length") == str(len(sent[3].body))
    assert early(proxy, "discarded") == 1 and early(proxy, "used") == 2
    # After a discarded one the next step waits (it would likely differ too).
    chunked = [request.header("transfer-encoding") == "chunked" for request in sent]
    assert chunked == [False, False, True, False, False, True]


def test_a_responses_session_goes_early(start_proxy) -> None:
    bodies = responses_bodies()
    plain, _ = drive(start_proxy, RESPONSES, bodies, {}, early_upload_bytes=0)
    sent, proxy = drive(start_proxy, RESPONSES, bodies, {}, early_upload_bytes=EARLY)
    assert [request.body for request in sent] == [request.body for request in plain]
    chunked = [request.header("transfer-encoding") == "chunked" for request in sent]
    assert chunked == [False, False] + [True] * (STEPS - 2)
    assert early(proxy, "used") == STEPS - 2


@pytest.mark.parametrize("settings", [{}, {"early_upload_bytes": 256 << 10}])
def test_off_by_default_and_below_the_threshold(start_proxy, settings) -> None:
    bodies = chat_bodies(False, {})[:-1]
    assert max(map(len, bodies)) < 256 << 10 < len(chat_bodies(False, {})[-1])
    sent, proxy = drive(start_proxy, CHAT, bodies, {}, **settings)
    assert all(request.header("transfer-encoding") is None for request in sent)
    assert early(proxy, "used") == early(proxy, "discarded") == 0


def test_a_request_that_went_early_is_bounded_by_the_total_timeout(start_proxy) -> None:
    """Its connection's timer holds the deadline: an engine that never answers gets a 504
    from the 0.3 s total timeout, not from the 30 s read one (the client waits 10 s)."""
    bodies = chat_bodies(False, {})[:3]
    with FakeUpstream(max_model_len=1 << 20) as upstream:
        proxy = start_proxy(
            upstream.url, early_upload_bytes=EARLY, total_timeout=0.3, read_timeout=30
        )
        with httpx.Client(base_url=proxy.url, timeout=10) as client:
            for body in bodies[:2]:
                assert client.post(CHAT, content=body).status_code == 200
            stalled = client.post(CHAT, content=bodies[2], headers={"x-fault": "stall-headers"})
    assert stalled.status_code == 504, stalled.text
    assert stalled.json()["error"]["code"] == "upstream_timeout"
    assert early(proxy, "used") == 1
