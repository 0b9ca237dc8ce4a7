"""A sub-agent fan-out for tests and the benchmark: N streamed requests at once with the
same new prefix (system prompt, tools, shared context) and a task of their own last.

Optionally the engine is kept busy while they arrive (a long request sent straight to it,
running when the fan-out starts), so they queue and are scheduled together: the case in
which an engine that shares a prefix only once computed (tests/support/late_cache.py)
computes it once per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx

CHAT = "/v1/chat/completions"
_VOCABULARY = (
    "account booking cabin change date economy fare flight gate itinerary luggage meal number "
    "passenger refund reservation route seat status ticket transfer upgrade visa window "
    "baggage airport arrival boarding business carrier charge check connection"
)
WORDS = tuple(_VOCABULARY.split())
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ').capitalize()} for the given record.",
            "parameters": {
                "type": "object",
                "properties": {"id": {"type": "string", "maxLength": 12}},
                "required": ["id"],
            },
        },
    }
    for name in ("get_booking", "get_flight_status", "search_flights", "update_seat")
]


def text(words: int, seed: int) -> str:
    pick = random.Random(seed).choice
    return " ".join(pick(WORDS) for _ in range(words))


def fan_out_bodies(
    n: int, prefix_words: int, seed: int, model: str, max_tokens: int = 8
) -> list[dict[str, Any]]:
    """N requests sharing a new prefix of about ``prefix_words`` words (about as many
    tokens); ``seed`` makes the prefix new (not cached by an earlier run)."""
    system = {
        "role": "system",
        "content": f"Sub-agent {seed}. " + text(prefix_words * 3 // 4, seed),
    }
    context = {"role": "user", "content": "Shared context: " + text(prefix_words // 4, seed + 1)}
    return [
        {
            "model": model,
            "messages": [
                system,
                context,
                {"role": "user", "content": f"Task {i}: " + text(24, seed * 1000 + i)},
            ],
            "tools": TOOLS,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        for i in range(n)
    ]


@dataclasses.dataclass(frozen=True)
class Result:
    status: int
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float | None
    e2e_s: float

    @property
    def computed(self) -> int:
        return self.prompt_tokens - self.cached_tokens


async def stream_one(client: httpx.AsyncClient, body: dict[str, Any]) -> Result:
    """One streamed request: its usage, time to first content or tool-call token, total."""
    started = time.perf_counter()
    ttft = None
    usage: dict[str, Any] = {}
    async with client.stream("POST", CHAT, json=body) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                if ttft is None and (delta.get("content") or delta.get("tool_calls")):
                    ttft = time.perf_counter() - started
    details = usage.get("prompt_tokens_details") or {}
    return Result(
        response.status_code,
        int(usage.get("prompt_tokens") or 0),
        int(details.get("cached_tokens") or 0),
        ttft,
        time.perf_counter() - started,
    )


async def fan_out(url: str, bodies: list[dict[str, Any]], timeout: float = 600) -> list[Result]:
    """Send every body at once; results in the order of ``bodies``."""
    limits = httpx.Limits(max_connections=len(bodies) + 4)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        return list(await asyncio.gather(*(stream_one(client, body) for body in bodies)))


async def running_requests(client: httpx.AsyncClient) -> float:
    """``vllm:num_requests_running`` from the engine's /metrics (vLLM and the simulator)."""
    total = 0.0
    for line in (await client.get("/metrics")).text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@contextlib.asynccontextmanager
async def busy_engine(
    engine_url: str, model: str, words: int, seed: int, timeout: float = 60
) -> AsyncIterator[list[Result]]:
    """Keep the engine busy: a long uncached request straight to it, running (its prefill
    under way) when the block starts. It finishes in the background and is awaited on
    exit; its result is then in the list the block got."""
    body = fan_out_bodies(1, words, seed, model, max_tokens=2)[0]
    done: list[Result] = []
    async with httpx.AsyncClient(base_url=engine_url, timeout=600) as client:
        blocker = asyncio.create_task(stream_one(client, body))
        deadline = time.monotonic() + timeout
        while await running_requests(client) < 1:
            if blocker.done() or time.monotonic() > deadline:
                raise RuntimeError("the blocking request never ran on the engine")
            await asyncio.sleep(0.005)
        try:
            yield done
        finally:
            done.append(await blocker)
