"""The warmer's decisions around one session (proxy.warmup.warmer), with the engine answered
in process: what a reply teaches the session's pacing, when a warm-up goes, and that its
result reaches the session's record through the tracker, only while the client is away."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from proxy import config
from proxy.exchange import Exchange
from proxy.metrics import Metrics
from proxy.sessions import Session
from proxy.turn import Turn
from proxy.upstream import Upstream
from proxy.warmup import Warmer
from tests.support.clock import Clock

MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
CALLS = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
    ],
}


class Engine:
    def __init__(self) -> None:
        self.paths: list[str] = []
        self.hosts: list[str] = []
        self.release = asyncio.Event()
        self.release.set()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        self.hosts.append(request.url.host)
        if request.url.path == "/metrics":
            return httpx.Response(200, content=b'vllm:num_requests_waiting{engine="0"} 0.0\n')
        if request.url.path == "/tokenize":
            await self.release.wait()
            return httpx.Response(200, content=json.dumps({"tokens": list(range(200))}).encode())
        usage = {"prompt_tokens": 161, "prompt_tokens_details": {"cached_tokens": 0}}
        return httpx.Response(200, content=json.dumps({"usage": usage}).encode())


class Harness:
    def __init__(self, engine: Engine, **overrides: Any) -> None:
        settings = config.load(
            {"upstream": "http://engine", "engine_block_size": 16, **overrides}, environ={}
        )
        self.registry = CollectorRegistry()
        self.posted: list[tuple[str, Any]] = []
        self.clock = Clock(1000.0)
        self.warmer = Warmer(
            settings,
            Upstream(settings, httpx.MockTransport(engine)),
            Metrics(self.registry),
            in_flight=lambda: 1,
            post=lambda key, change: self.posted.append((key, change)),
            clock=self.clock,
            wall=self.clock,
        )
        self.session = Session("s")

    def reply(self, *, started: float, after_tools: bool, reply: dict = CALLS) -> Turn:
        turn = Turn(self.session, MESSAGES, [b"k"], forwarded_messages=MESSAGES)
        turn.request = {"model": "m", "messages": MESSAGES}
        turn.follows_tool_calls = after_tools
        exchange = Exchange("/v1/chat/completions", "POST", started=started, reply=reply)
        self.warmer.after_reply(turn, exchange)
        return turn

    def count(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    async def settle(self) -> None:
        await asyncio.gather(*self.warmer.running(), return_exceptions=True)


@pytest.mark.anyio
async def test_a_reply_with_tool_calls_is_warmed_and_the_session_told() -> None:
    h = Harness(Engine())
    h.reply(started=999.0, after_tools=False)
    await h.settle()
    assert h.count("prefill_proxy_warmups_total", trigger="tool_calls", outcome="ok") == 1
    assert h.session.pace.replied_at == 1000.0  # kept in the record, saved with the reply
    ((key, change),) = h.posted
    record = Session("s")
    change(record)  # applied when the session is next opened
    assert key == "s" and record.warmed
    await h.warmer.aclose()


@pytest.mark.anyio
async def test_the_tool_round_is_measured_into_the_sessions_pace() -> None:
    h = Harness(Engine())
    h.reply(started=999.0, after_tools=False)
    h.clock.now = 1004.0
    h.reply(started=1003.0, after_tools=True)  # the client was away 3 s
    assert h.session.pace.gaps == [3.0]
    h.clock.now = 1010.0
    h.reply(started=1009.0, after_tools=True, reply={"role": "assistant", "content": "Sunny."})
    assert h.session.pace.gaps == [3.0, 5.0] and h.session.pace.replied_at is None
    await h.warmer.aclose()


@pytest.mark.anyio
async def test_a_client_back_before_the_warmup_is_not_told_it_was_warmed() -> None:
    engine = Engine()
    engine.release.clear()  # the warm-up is still rendering when the client comes back
    h = Harness(engine)
    h.reply(started=999.0, after_tools=False)
    await asyncio.sleep(0.01)
    h.warmer.client_back("s")
    engine.release.set()
    await h.settle()
    assert h.posted == []  # the flag would label the step after the one that came back
    await h.warmer.aclose()


@pytest.mark.anyio
async def test_with_warmup_off_every_chance_is_counted_as_skipped() -> None:
    engine = Engine()
    h = Harness(engine, warmup=False)
    h.reply(started=999.0, after_tools=False)
    await h.settle()
    assert h.count("prefill_proxy_warmups_skipped_total", reason="disabled") == 1
    assert engine.paths == [] and h.posted == []
    await h.warmer.aclose()


@pytest.mark.anyio
async def test_a_warmup_goes_to_the_sessions_engine_and_asks_it_how_busy_it_is() -> None:
    """Among several engines, the session's engine is the one whose cache is warmed and
    whose queue decides (not the first upstream's)."""
    engine = Engine()
    h = Harness(engine, upstream="http://engine-a:8000,http://engine-b:8000")
    h.session.engine = "http://engine-b:8000"
    h.reply(started=999.0, after_tools=False)
    await h.settle()
    assert h.count("prefill_proxy_warmups_total", trigger="tool_calls", outcome="ok") == 1
    assert set(engine.paths) >= {"/metrics", "/tokenize", "/v1/completions"}
    assert set(engine.hosts) == {"engine-b"}
    await h.warmer.aclose()
