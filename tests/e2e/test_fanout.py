"""Fan-out holds and tool batching over real sockets: the proxy in front of the simulator
(and of the fake upstream, for failures on demand)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from proxy.rewrite.tool_batching import INSTRUCTION
from proxy.sim.app import create_sim_app
from proxy.sim.config import SimConfig
from tests.support.fake_upstream import FakeUpstream
from tests.support.fanout_load import CHAT, busy_engine, fan_out, fan_out_bodies
from tests.support.late_cache import late_cache_sim_app
from tests.support.proxies import RunningProxy
from tests.support.servers import serve

N = 6
PREFIX_WORDS = 2000
MODEL = "sim-model"
# A 16k-token step budget, so the whole fan-out fits one step; speed 0.25 keeps the
# engine busy with the blocking request for ~1.6 s while the fan-out arrives.
SIM = SimConfig(speed=0.25, max_num_batched_tokens=16384, max_model_len=32768)
ENGINES: dict[str, Callable[[SimConfig, CollectorRegistry], Any]] = {
    "shares-in-flight": lambda config, registry: create_sim_app(config, registry=registry),
    "computed-only": late_cache_sim_app,
}


@pytest.fixture
def start_sim() -> Iterator[Callable[[str], str]]:
    servers: list[Any] = []

    def start(engine: str) -> str:
        server = serve(ENGINES[engine](SIM, CollectorRegistry()))
        servers.append(server)
        return server.__enter__()

    yield start
    for server in reversed(servers):
        server.__exit__(None, None, None)


def computed(proxy: RunningProxy, sim_url: str, seed: int) -> tuple[int, int]:
    """Prompt tokens the engine computed for a fan-out arriving while it is busy, and the
    prompt length of one of its requests."""

    async def run() -> list[Any]:
        async with busy_engine(sim_url, MODEL, 6000, seed=seed + 500):
            return await fan_out(proxy.url, fan_out_bodies(N, PREFIX_WORDS, seed, MODEL))

    results = asyncio.run(run())
    assert all(r.status == 200 and r.ttft_s is not None for r in results)
    return sum(r.computed for r in results), results[0].prompt_tokens


def holds(proxy: RunningProxy, outcome: str) -> float:
    return proxy.sample("prefill_proxy_fanout_holds_total", outcome=outcome)


@pytest.mark.parametrize("engine", ["computed-only", "shares-in-flight"])
def test_held_fan_out_computes_the_new_prefix_once(start_proxy, start_sim, engine: str) -> None:
    sim = start_sim(engine)
    held = start_proxy(sim, fanout_hold=10.0)
    unheld = start_proxy(sim, fanout_hold=0)
    with_holds, prompt = computed(held, sim, seed=1)
    without, _ = computed(unheld, sim, seed=2)
    assert prompt > 2000
    assert with_holds < prompt + N * 100  # the prefix once, then each task's own tail
    assert holds(held, "released") == N - 1 and holds(held, "timeout") == 0
    assert held.sample("prefill_proxy_fanout_hold_seconds_count") == N - 1
    assert holds(unheld, "released") == 0
    if engine == "computed-only":
        assert without > (N - 1) * prompt  # every request computed the prefix
    else:  # vLLM V1 shares blocks the moment they are scheduled: nothing to save
        assert without < prompt + N * 100


def test_a_stepping_session_is_never_held(start_proxy, start_sim) -> None:
    sim = start_sim("shares-in-flight")
    proxy = start_proxy(sim, fanout_hold=10.0)
    body = fan_out_bodies(1, PREFIX_WORDS, 7, MODEL)[0]
    with httpx.Client(base_url=proxy.url, timeout=60) as client:
        messages = body["messages"]
        for step in range(3):
            reply = client.post(CHAT, json={**body, "stream": False, "messages": messages})
            assert reply.status_code == 200
            answer = reply.json()["choices"][0]["message"]
            messages = [*messages, answer, {"role": "user", "content": f"And {step}?"}]
    assert holds(proxy, "released") + holds(proxy, "timeout") == 0


# --- failures, on the fake upstream ----------------------------------------------------

STALL = {"x-fault": "stall-headers"}  # the fake upstream never answers this one


def chat_requests(upstream: FakeUpstream) -> int:
    return sum(1 for r in upstream.received if r.path == CHAT)


async def stalled_leader(proxy: RunningProxy, upstream: FakeUpstream, body: dict) -> Any:
    """Start a request the upstream never answers; return its task once it is upstream."""
    client = httpx.AsyncClient(base_url=proxy.url, timeout=30)
    task = asyncio.create_task(client.post(CHAT, json=body, headers=STALL))
    while chat_requests(upstream) < 1:
        await asyncio.sleep(0.005)
    task.add_done_callback(lambda _: asyncio.ensure_future(client.aclose()))
    return task


def test_followers_of_a_failed_leader_take_over(start_proxy, fake_upstream) -> None:
    proxy = start_proxy(fake_upstream.url, fanout_hold=30.0, read_timeout=1.0)
    bodies = fan_out_bodies(4, 1500, 3, "fake")

    async def run() -> tuple[Any, Any]:
        leader = await stalled_leader(proxy, fake_upstream, bodies[0])
        followers = await fan_out(proxy.url, bodies[1:])
        return await leader, followers

    leader, followers = asyncio.run(run())
    assert leader.status_code == 504  # the upstream never answered within read_timeout
    assert [r.status for r in followers] == [200, 200, 200]
    assert holds(proxy, "released") == 3 and holds(proxy, "timeout") == 0
    assert chat_requests(fake_upstream) == 4


def test_a_held_client_that_leaves_leaves_nothing_behind(start_proxy, fake_upstream) -> None:
    proxy = start_proxy(fake_upstream.url, fanout_hold=30.0, read_timeout=1.0)
    bodies = fan_out_bodies(3, 1500, 4, "fake")

    async def run() -> Any:
        leader = await stalled_leader(proxy, fake_upstream, bodies[0])
        async with httpx.AsyncClient(base_url=proxy.url, timeout=0.2) as client:
            with pytest.raises(httpx.ReadTimeout):  # held: it gives up and hangs up
                await client.post(CHAT, json=bodies[1])
        return await leader

    assert asyncio.run(run()).status_code == 504
    in_flight = "prefill_proxy_in_flight_requests"
    proxy.wait_for(lambda: proxy.sample(in_flight) == 0)
    assert holds(proxy, "released") == 1  # it took over from the failed leader, then ended
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        assert client.post(CHAT, json={**bodies[2], "stream": False}).status_code == 200
    assert holds(proxy, "released") + holds(proxy, "timeout") == 1  # not held: no stale leader


# --- tool batching ---------------------------------------------------------------------


def test_tool_batching_reaches_the_engine(start_proxy, fake_upstream) -> None:
    proxy = start_proxy(fake_upstream.url, batching_instruction=True, fanout_hold=0)
    body = {**fan_out_bodies(1, 50, 5, "fake")[0], "stream": False}
    with httpx.Client(base_url=proxy.url, timeout=10) as client:
        assert client.post(CHAT, json=body).status_code == 200
        assert client.post(CHAT, json={**body, "parallel_tool_calls": False}).status_code == 200
    first, second = (json.loads(r.body) for r in fake_upstream.received if r.path == CHAT)
    assert first["parallel_tool_calls"] is True
    assert second["parallel_tool_calls"] is False  # the client's choice
    assert first["messages"][0]["content"].endswith("\n\n" + INSTRUCTION)
    assert first["messages"][1:] == body["messages"][1:]


def tool_call(n: int) -> dict[str, Any]:
    arguments = json.dumps({"id": f"B{n}"})
    return {
        "id": f"c{n}",
        "type": "function",
        "function": {"name": "get_booking", "arguments": arguments},
    }


def test_round_trips_are_measured_on_a_tool_loop(start_proxy, start_sim) -> None:
    proxy = start_proxy(start_sim("shares-in-flight"), fanout_hold=0)
    body = {**fan_out_bodies(1, 100, 6, MODEL)[0], "max_tokens": None}  # whole replies
    replies: list[dict[str, Any]] = [
        {"role": "assistant", "content": None, "tool_calls": [tool_call(1), tool_call(2)]},
        {"role": "assistant", "content": None, "tool_calls": [tool_call(3)]},
        {"role": "assistant", "content": "Both bookings are confirmed."},
    ]
    messages = body["messages"]
    with httpx.Client(base_url=proxy.url, timeout=30) as client:
        for reply in replies:
            sent = {**body, "messages": messages, "x_replay_reply": reply}
            with client.stream("POST", CHAT, json=sent) as response:
                assert response.status_code == 200
                response.read()
            results = [
                {"role": "tool", "tool_call_id": call["id"], "content": "confirmed"}
                for call in reply.get("tool_calls") or []
            ]
            messages = [*messages, reply, *results]
    proxy.wait_for(lambda: proxy.sample("prefill_proxy_steps_per_user_turn_count") == 1)
    assert proxy.sample("prefill_proxy_tool_calls_per_step_count") == 2
    assert proxy.sample("prefill_proxy_tool_calls_per_step_sum") == 3
    assert proxy.sample("prefill_proxy_steps_per_user_turn_sum") == 3


# --- real vLLM -------------------------------------------------------------------------


@pytest.mark.vllm
def test_held_fan_out_on_vllm(vllm_server, start_proxy) -> None:
    """Four sub-agents at once on real vLLM: three held until the first one's first token,
    and the engine computes the shared ~1.5k-token prefix once."""
    proxy = start_proxy(vllm_server.base_url, fanout_hold=60.0)
    bodies = fan_out_bodies(4, 1500, 11, vllm_server.model)
    results = asyncio.run(fan_out(proxy.url, bodies))
    assert [r.status for r in results] == [200] * 4
    prompt = results[0].prompt_tokens
    assert prompt > 1500
    assert sum(r.computed for r in results) < prompt + 4 * 128  # a few blocks of tail each
    assert holds(proxy, "released") == 3 and holds(proxy, "timeout") == 0
