"""The simulator against real vLLM: the same request sequence, the same tokenizer and block
size, must give the same prompt_tokens and the same cached_tokens on every request.

Two conversations share a system prompt and tools; one grows over six requests (tool
calls with compact JSON arguments that the template re-serializes, tool results, text
turns), the other starts later and interleaves with it; then the first request twice
more under a cache_salt. Both servers start cold (/reset_prefix_cache).

The models answer differently (random weights vs synthetic words), so the assistant
turns in each next request are fixed text, never an engine's output: decode blocks then
never match the next prompt on either side (each fixed turn starts with a token neither
engine emits first), and the comparison is about prompt blocks: rendering,
tokenization, hashing, alignment, the last-token rule, sharing and salting.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from proxy.sim.app import create_sim_app
from proxy.sim.config import SimConfig
from tests.support.servers import serve

pytestmark = pytest.mark.vllm

BLOCK = 32  # tests/vllm/serve.sh
SYSTEM = (
    "You are the support agent of Northwind Travel. Follow the policy below exactly.\n"
    + "\n".join(
        f"Rule {i}: when a customer asks about booking {i}, check the reservation with "
        f"get_reservation, confirm the passenger name, and never change more than {i % 4 + 1} "
        "segments at once without asking again."
        for i in range(1, 26)
    )
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_reservation",
            "description": "Look up a reservation by its code.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}, "include_history": {"type": "boolean"}},
                "required": ["code"],
            },
        },
    },
    {
        "type": "function",
        "function": {  # no description: vLLM renders "description": null
            "name": "cancel_segment",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}, "segment": {"type": "integer"}},
            },
        },
    },
]


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        ],
    }


def tool_result(call_id: str, code: str, rows: int) -> dict[str, Any]:
    lines = [
        f"segment {i}: {code} flight NW{100 + i} seat {i}C status confirmed" for i in range(rows)
    ]
    return {"role": "tool", "tool_call_id": call_id, "content": "\n".join(lines)}


def conversation_a() -> list[list[dict[str, Any]]]:
    """Six requests of one growing conversation (each the full history so far)."""
    turns: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Hi, I need to check booking ABC123 for Maria Lopez."},
    ]
    steps = [list(turns)]
    turns += [
        tool_call("call_a1", "get_reservation", '{"code":"ABC123","include_history":true}'),
        tool_result("call_a1", "ABC123", 40),
    ]
    steps.append(list(turns))
    turns += [
        {"role": "assistant", "content": "[a3] I found booking ABC123 with 40 segments."},
        {"role": "user", "content": "Please cancel segment 7, it is the wrong date."},
    ]
    steps.append(list(turns))
    turns += [
        tool_call("call_a2", "cancel_segment", '{"code":"ABC123","segment":7}'),
        tool_result("call_a2", "ABC123-cancelled", 12),
    ]
    steps.append(list(turns))
    turns += [
        {"role": "assistant", "content": "[a5] Segment 7 is cancelled; the refund follows."},
        {"role": "user", "content": "Thanks. Can you also show the full history again?"},
    ]
    steps.append(list(turns))
    turns += [
        tool_call("call_a3", "get_reservation", '{"code": "ABC123", "include_history": true}'),
        tool_result("call_a3", "ABC123", 60),
    ]
    steps.append(list(turns))
    return steps


def conversation_b() -> list[list[dict[str, Any]]]:
    """Four requests of a second conversation with the same system prompt and tools."""
    turns: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Hello, booking XYZ789 please, name Chen Wei."},
    ]
    steps = [list(turns)]
    turns += [
        tool_call("call_b1", "get_reservation", '{"code":"XYZ789"}'),
        tool_result("call_b1", "XYZ789", 25),
    ]
    steps.append(list(turns))
    turns += [
        {"role": "assistant", "content": "[b3] Booking XYZ789 has 25 segments, all confirmed."},
        {
            "role": "user",
            "content": "Great, nothing else then. Actually, is segment 3 a window seat?",
        },
    ]
    steps.append(list(turns))
    turns += [
        {"role": "assistant", "content": "[b4] Seat 3C is an aisle seat."},
        {"role": "user", "content": "Then please cancel segment 3."},
    ]
    steps.append(list(turns))
    return steps


def request_order() -> list[tuple[str, list[dict[str, Any]]]]:
    a, b = conversation_a(), conversation_b()
    order = ["a", "a", "b", "a", "b", "a", "b", "a", "b", "a"]
    queues = {"a": iter(enumerate(a, 1)), "b": iter(enumerate(b, 1))}
    named = []
    for name in order:
        step, messages = next(queues[name])
        named.append((f"{name}{step}", messages))
    return named


@pytest.fixture
def sim_url(vllm_server) -> Iterator[str]:
    from tests.support.vllm import DEFAULT_MODEL

    config = SimConfig(
        model_name=vllm_server.model,
        tokenizer=str(DEFAULT_MODEL),
        block_size=BLOCK,
        max_model_len=16384,
        capacity_tokens=262_144,  # vLLM's 1 GiB of KV for this model
        speed=1000.0,
    )
    with serve(create_sim_app(config)) as url:
        yield url


def reset(client: httpx.Client) -> None:
    """vLLM refuses while blocks are held (an earlier test's request may be ending)."""
    deadline = time.monotonic() + 30
    while not client.post("/reset_prefix_cache").json()["success"]:
        assert time.monotonic() < deadline, "prefix cache reset kept failing"
        time.sleep(0.1)


def usage(
    client: httpx.Client, model: str, messages: list[dict[str, Any]], **extra: Any
) -> tuple[int, int]:
    body = {"model": model, "messages": messages, "tools": TOOLS, "max_tokens": 8, "temperature": 0}
    body |= extra
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    data = response.json()["usage"]
    return data["prompt_tokens"], data["prompt_tokens_details"]["cached_tokens"]


def test_sim_and_vllm_agree_on_prompt_and_cached_tokens(vllm_server, sim_url) -> None:
    with (
        httpx.Client(base_url=vllm_server.base_url, timeout=300) as vllm,
        httpx.Client(base_url=sim_url, timeout=60) as sim,
    ):
        reset(vllm)
        reset(sim)
        rows = []
        for name, messages in request_order():
            real = usage(vllm, vllm_server.model, messages)
            simulated = usage(sim, vllm_server.model, messages)
            rows.append((name, *real, *simulated))
        first = request_order()[0][1]
        for name in ("a1+salt", "a1+salt"):  # a tenant's salt: cold once, then its own hits
            real = usage(vllm, vllm_server.model, first, cache_salt="tenant-1")
            simulated = usage(sim, vllm_server.model, first, cache_salt="tenant-1")
            rows.append((name, *real, *simulated))
    table = "\n".join(
        ["request  vllm prompt/cached  sim prompt/cached"]
        + [f"{n:7}  {p:6} / {c:6}       {sp:6} / {sc:6}" for n, p, c, sp, sc in rows]
    )
    print("\n" + table)
    assert [row[1:3] for row in rows] == [row[3:5] for row in rows], table
    # The sequence must exercise what it claims: long prompts, sharing, growth.
    assert max(row[1] for row in rows) > 3000
    assert rows[-2][2] == 0 and rows[-1][2] > 0
    assert rows[2][0] == "b1" and rows[2][2] > 0  # b1 reuses a's system prompt and tools
    assert all(row[2] % BLOCK == 0 and row[2] <= (row[1] - 1) // BLOCK * BLOCK for row in rows)
