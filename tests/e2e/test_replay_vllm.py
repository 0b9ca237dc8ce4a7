"""Two real agent conversations replayed against real vLLM (CPU build), straight and
through the proxy: the instrument measures the real engine, and the (still empty) proxy
changes nothing the engine sees."""

from __future__ import annotations

import asyncio

import pytest

from proxy.replay import report, traces
from proxy.replay.records import Run
from proxy.replay.runner import Options, Replayer, make_client, reset_prefix_cache
from tests.unit.test_replay_traces import DEV

pytestmark = pytest.mark.vllm

# The two shortest conversations of the dev traces (5 and 7 model calls): a cold prefill of
# their ~6k-token first prompt takes this CPU engine a few seconds.
SHORTEST = ("taubench/gpt-4o/airline/task1/trial0", "taubench/gpt-4o/airline/task4/trial1")


def conversations() -> list[traces.Conversation]:
    return [c for c in traces.load(DEV) if c.id in SHORTEST]


def replay(url: str, engine: str, model: str, profile: str) -> Run:
    async def go() -> Run:
        async with make_client(1, 300) as http:
            await reset_prefix_cache(http, engine)
            options = Options(model=model, profile=profile, max_tokens=4)
            return await Replayer(http, url, options).run(conversations())

    return asyncio.run(go())


def share(run: Run) -> float:
    summary = report.summarize(run.steps, run.wall_s)
    assert summary["errors"] == 0 and summary["requests"] == 12
    return summary["cached_share_after_first_step"]


def test_two_conversations_direct_and_through_the_proxy(vllm_server, start_proxy) -> None:
    """A faithful client loses nothing through the proxy; a client with a clock in its
    system prompt gets nearly nothing from the cache straight, and as much as the faithful
    one through the proxy."""
    proxy = start_proxy(vllm_server.base_url)
    engine, model = vllm_server.base_url, vllm_server.model
    ideal = share(replay(engine, engine, model, "faithful"))
    assert ideal > 0.8  # append-only history hits
    proxied = replay(proxy.url, engine, model, "faithful")
    assert share(proxied) > ideal - 0.005
    assert all(step.ttft_s is not None and step.ttft_s > 0 for step in proxied.steps)
    assert share(replay(engine, engine, model, "timestamped")) < 0.2
    assert share(replay(proxy.url, engine, model, "timestamped")) > ideal - 0.02
