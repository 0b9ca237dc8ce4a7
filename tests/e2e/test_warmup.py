"""Speculative prefill end to end: the proxy in front of the simulator (real uvicorn servers
on loopback), a client that streams a tool-call step, then the step with the tool result.

The conversations are built so the warm-up makes a measurable difference even on an idle
engine: the reply's end-of-turn token is never fed back (vLLM and the sim alike), so
without a warm-up the block that holds it is computed again by the next step. The length
of the tool call is padded until that block boundary falls there (see ``aligned_step``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from proxy import config
from proxy.engine import QUEUE_MIN_READINGS, EngineMonitor
from proxy.exchange import Exchange
from proxy.metrics import Metrics
from proxy.sessions import Session
from proxy.sim.app import create_sim_app
from proxy.sim.config import SimConfig
from proxy.turn import Turn
from proxy.upstream import Upstream
from proxy.warmup import Warmer
from proxy.warmup.policy import CACHED_STREAK, PROBE_EVERY, RETRY_S
from tests.support.proxies import RunningProxy
from tests.support.servers import serve

B = 16  # the simulator's block size (it says so in its /metrics)
MODEL = "sim-model"
# In the proxy's canonical form (keys sorted), so the proxy forwards them as they are.
TOOLS = [
    {
        "function": {
            "description": "Look an order up",
            "name": "lookup",
            "parameters": {"properties": {"order": {"type": "string"}}, "type": "object"},
        },
        "type": "function",
    }
]
SKIPPED = "prefill_proxy_warmups_skipped_total"
WARMUPS_OK = ("prefill_proxy_warmups_total", {"trigger": "tool_calls", "outcome": "ok"})


class EngineGate:
    """The simulator behind a switchboard the test holds: requests to ``held`` paths wait
    until released, ``missing`` paths answer 404 like a server without the route, and
    ``failing`` ones answer 500, ``metrics`` replaces the engine's /metrics text. Runs in
    the server's thread."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.held: set[str] = set()
        self.missing: set[str] = set()
        self.failing: set[str] = set()
        self.metrics: bytes | None = None
        self.waiting = 0  # requests being held now
        self.release = threading.Event()
        self.paths: list[str] = []
        self.completions: list[dict[str, Any]] = []  # bodies of /v1/completions requests

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        self.paths.append(path)
        if path == "/v1/completions":
            body = b""
            while (message := await receive())["type"] == "http.request":
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            self.completions.append(json.loads(body))
            receive = _replay(body)
        if path in self.missing:
            return await _answer(send, 404, b'{"detail":"Not Found"}')
        if path in self.failing:
            return await _answer(send, 500, b'{"error":{"message":"boom","code":500}}')
        if path == "/metrics" and self.metrics is not None:
            return await _answer(send, 200, self.metrics)
        if path in self.held:
            self.waiting += 1
            await asyncio.to_thread(self.release.wait)
            self.waiting -= 1
        return await self.app(scope, receive, send)


def _replay(body: bytes) -> Any:
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # as a connection that stays open
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


async def _answer(send: Any, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


@dataclasses.dataclass
class Engine:
    url: str
    gate: EngineGate


@pytest.fixture
def engine() -> Iterator[Engine]:
    gate = EngineGate(create_sim_app(SimConfig(speed=1000.0, max_model_len=8192)))
    with serve(gate) as url:
        yield Engine(url, gate)
    gate.release.set()


@pytest.fixture
def proxy_on(engine, start_proxy) -> Callable[..., RunningProxy]:
    def start(**overrides: Any) -> RunningProxy:
        return start_proxy(engine.url, **overrides)

    return start


def conversation(tag: str) -> list[dict[str, Any]]:
    system = f"{tag}: you look orders up for customers of a shop. " * 30
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Where is my order {tag}?"},
    ]


def tool_reply(padding: int) -> dict[str, Any]:
    arguments = json.dumps({"order": "A" + "7" * padding})
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup", "arguments": arguments},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def tokenize(url: str, messages: list[dict[str, Any]], generation: bool) -> list[int]:
    body = {
        "model": MODEL,
        "messages": messages,
        "tools": TOOLS,
        "add_generation_prompt": generation,
    }
    response = httpx.post(url + "/tokenize", json=body, timeout=10)
    response.raise_for_status()
    return response.json()["tokens"]


def aligned_step(engine: Engine, tag: str) -> tuple[list[dict[str, Any]], dict[str, Any], int]:
    """(messages, tool-call reply, warm length): padded so that the warmed prompt (messages
    plus reply, without a generation prompt) is one token past a block boundary; the
    reply's end-of-turn token then starts a block the next step cannot find cached unless
    a warm-up computed it."""
    messages = conversation(tag)
    for padding in range(4 * B):
        reply = tool_reply(padding)
        count = len(tokenize(engine.url, [*messages, reply], generation=False))
        if (count - 1) % B == 0:  # the reply's end-of-turn token ends a block
            engine.gate.paths.clear()  # what the engine was asked from here on is the proxy's doing
            return messages, reply, count
    raise AssertionError("no padding aligns the reply")


def chat(proxy: RunningProxy, messages: list, reply: dict | None, session: str) -> dict:
    """One streamed step through the proxy (the sim answers ``reply``); its usage."""
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "tools": TOOLS}
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    if reply is not None:
        body["x_replay_reply"] = reply
    response = httpx.post(
        proxy.url + "/v1/chat/completions",
        json=body,
        headers={"x-session-id": session},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line[6:7] == "{"]
    return next(e["usage"] for e in events if e.get("usage"))


def tool_result() -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": "call_1", "content": "Shipped yesterday."}


def cached(usage: dict) -> int:
    return int(usage["prompt_tokens_details"]["cached_tokens"])


def test_a_tool_call_reply_warms_the_next_steps_prefix(engine, proxy_on) -> None:
    gate = engine.gate
    proxy = proxy_on()
    messages, reply, count = aligned_step(engine, "warm")
    chat(proxy, messages, reply, "s1")
    proxy.wait_for(lambda: proxy.sample(WARMUPS_OK[0], **WARMUPS_OK[1]) == 1)
    (warmup,) = gate.completions
    nxt = [*messages, reply, tool_result()]
    assert warmup["max_tokens"] == 1 and "priority" not in warmup
    assert len(warmup["prompt"]) == count  # its full blocks, and one token more
    assert tokenize(engine.url, nxt, generation=True)[:count] == warmup["prompt"]
    # Computed by the warm-up: the end-of-turn token and the newline after it, plus the
    # one token every prompt computes.
    assert 1 <= proxy.sample("prefill_proxy_warmup_computed_tokens_total") <= B + 1
    second = chat(proxy, nxt, None, "s1")
    assert cached(second) == count - 1  # every full block of the warmed prompt
    assert proxy.sample("prefill_proxy_step_time_to_first_token_seconds_count", warmed="yes") == 1
    assert proxy.sample("prefill_proxy_step_time_to_first_token_seconds_count", warmed="no") == 0
    assert proxy.sample("prefill_proxy_warmed_steps_total", outcome="cached") == 1


def test_a_warmup_evicted_before_its_step_counts_as_missed(engine, proxy_on) -> None:
    proxy = proxy_on()
    messages, reply, _ = aligned_step(engine, "evicted")
    chat(proxy, messages, reply, "s1")
    proxy.wait_for(lambda: proxy.sample(WARMUPS_OK[0], **WARMUPS_OK[1]) == 1)
    httpx.post(engine.url + "/reset_prefix_cache").raise_for_status()  # the blocks are gone
    chat(proxy, [*messages, reply, tool_result()], None, "s1")
    assert proxy.sample("prefill_proxy_warmed_steps_total", outcome="missed") == 1
    assert proxy.sample("prefill_proxy_warmed_steps_total", outcome="cached") == 0


def test_without_warmup_the_next_step_recomputes_the_replys_last_block(engine, proxy_on) -> None:
    proxy = proxy_on(warmup=False)
    messages, reply, count = aligned_step(engine, "cold")
    chat(proxy, messages, reply, "s1")
    second = chat(proxy, [*messages, reply, tool_result()], None, "s1")
    assert cached(second) == count - 1 - B
    assert proxy.sample("prefill_proxy_warmups_skipped_total", reason="disabled") == 1
    assert proxy.sample("prefill_proxy_step_time_to_first_token_seconds_count", warmed="no") == 1
    assert "/tokenize" not in engine.gate.paths and "/metrics" not in engine.gate.paths


def test_the_step_after_an_unwarmed_tool_call_is_labelled_so(engine, proxy_on) -> None:
    proxy = proxy_on(warmup_max_proxy_inflight=0)  # the replying request itself is in flight
    messages, reply, _ = aligned_step(engine, "unwarmed")
    chat(proxy, messages, reply, "s1")
    chat(proxy, [*messages, reply, tool_result()], None, "s1")
    assert proxy.sample("prefill_proxy_warmups_skipped_total", reason="proxy_busy") == 1
    assert proxy.sample("prefill_proxy_step_time_to_first_token_seconds_count", warmed="no") == 1


def test_a_reply_without_tool_calls_warms_nothing(engine, proxy_on) -> None:
    gate = engine.gate
    proxy = proxy_on()
    answer = {"role": "assistant", "content": "It shipped yesterday."}
    chat(proxy, conversation("text"), answer, "s1")
    chat(proxy, [*conversation("text"), answer, {"role": "user", "content": "thanks"}], None, "s1")
    assert "/tokenize" not in gate.paths
    assert proxy.sample("prefill_proxy_warmups_total", trigger="tool_calls", outcome="ok") == 0


def test_one_warmup_per_session_and_a_global_cap(engine, proxy_on) -> None:
    gate = engine.gate
    gate.held.add("/v1/completions")
    proxy = proxy_on(warmup_max_inflight=2)
    messages, reply, _ = aligned_step(engine, "capped")
    chat(proxy, messages, reply, "s1")  # warms, held
    proxy.wait_for(lambda: gate.waiting == 1)
    chat(proxy, messages, reply, "s1")  # same session: busy
    chat(proxy, messages, reply, "s2")  # warms, held: the cap is reached
    proxy.wait_for(lambda: gate.waiting == 2)
    chat(proxy, messages, reply, "s3")
    skipped = "prefill_proxy_warmups_skipped_total"
    assert proxy.sample(skipped, reason="session_busy") == 1
    assert proxy.sample(skipped, reason="global_cap") == 1
    gate.release.set()
    proxy.wait_for(lambda: proxy.sample(WARMUPS_OK[0], **WARMUPS_OK[1]) == 2)
    chat(proxy, messages, reply, "s4")  # room again (a new session: its round is unknown)
    proxy.wait_for(lambda: proxy.sample(WARMUPS_OK[0], **WARMUPS_OK[1]) == 3)


def test_no_warmup_while_the_engine_queues_requests(engine, proxy_on) -> None:
    gate = engine.gate
    gate.metrics = b'vllm:num_requests_waiting{engine="0",model_name="m"} 3.0\n'
    proxy = proxy_on(warmup_max_waiting=2)
    messages, reply, _ = aligned_step(engine, "busy")
    chat(proxy, messages, reply, "s1")
    skipped = "prefill_proxy_warmups_skipped_total"
    proxy.wait_for(lambda: proxy.sample(skipped, reason="engine_busy") == 1)
    assert "/tokenize" not in gate.paths
    gate.metrics = b'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
    scrapes = gate.paths.count("/metrics")
    proxy.wait_for(lambda: gate.paths.count("/metrics") > scrapes)  # read after the change
    chat(proxy, messages, reply, "s2")
    proxy.wait_for(lambda: proxy.sample(WARMUPS_OK[0], **WARMUPS_OK[1]) == 1)


def test_a_prompt_under_one_block_is_not_warmed(engine, proxy_on) -> None:
    gate = engine.gate
    proxy = proxy_on(engine_block_size=8192)
    messages, reply, _ = aligned_step(engine, "short")
    chat(proxy, messages, reply, "s1")
    skipped = "prefill_proxy_warmups_skipped_total"
    proxy.wait_for(lambda: proxy.sample(skipped, reason="too_short") == 1)
    assert "/v1/completions" not in gate.paths


def test_without_token_routes_the_warmup_is_a_chat_completion(engine, proxy_on) -> None:
    gate = engine.gate
    messages, reply, count = aligned_step(engine, "fallback")
    gate.missing |= {"/tokenize", "/v1/completions"}
    proxy = proxy_on()
    chat(proxy, messages, reply, "s1")
    proxy.wait_for(lambda: proxy.sample(WARMUPS_OK[0], **WARMUPS_OK[1]) == 1)
    assert gate.paths.count("/v1/chat/completions") == 2  # the step and its warm-up
    second = chat(proxy, [*messages, reply, tool_result()], None, "s1")
    assert cached(second) == count - 1
    chat(proxy, messages, reply, "s2")  # straight to chat now: /tokenize is not tried again
    proxy.wait_for(lambda: proxy.sample(WARMUPS_OK[0], **WARMUPS_OK[1]) == 2)
    assert gate.paths.count("/tokenize") == 1


def test_a_failed_warmup_is_counted_and_the_client_never_sees_it(engine, proxy_on) -> None:
    gate = engine.gate
    gate.failing.add("/v1/completions")
    proxy = proxy_on()
    messages, reply, _ = aligned_step(engine, "failing")
    chat(proxy, messages, reply, "s1")
    labels = {"trigger": "tool_calls", "outcome": "error"}
    proxy.wait_for(lambda: proxy.sample("prefill_proxy_warmups_total", **labels) == 1)
    second = chat(proxy, [*messages, reply, tool_result()], None, "s1")
    assert second["prompt_tokens"] > 0
    assert (
        proxy.sample(
            "prefill_proxy_requests_total", route="/v1/chat/completions", model=MODEL, status="200"
        )
        == 2
    )


@pytest.mark.anyio
async def test_warm_on_request_and_shutdown_cancels_what_is_in_flight(engine) -> None:
    gate = engine.gate
    settings = config.load({"upstream": engine.url}, environ={})
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    upstream = Upstream(settings)
    warmer = Warmer(settings, upstream, metrics, in_flight=lambda: 0)
    messages, reply, count = aligned_step(engine, "compacted")
    request = {"model": MODEL, "messages": [*messages, reply], "tools": TOOLS}

    def sample(outcome: str) -> float:
        labels = {"trigger": "compaction", "outcome": outcome}
        return registry.get_sample_value("prefill_proxy_warmups_total", labels) or 0.0

    warmer.warm(request, (), "s1")
    await _until(lambda: sample("ok") == 1)
    tokens = tokenize(engine.url, [*messages, reply, tool_result()], generation=True)
    usage = httpx.post(
        engine.url + "/v1/completions", json={"prompt": tokens, "max_tokens": 1}
    ).json()
    assert cached(usage["usage"]) == count - 1

    gate.held.add("/v1/completions")
    warmer.warm(request, (), "s2")
    await _until(lambda: gate.waiting == 1)
    await warmer.aclose()  # returns: the held warm-up was cancelled
    assert sample("error") == 0 and sample("ok") == 1
    gate.release.set()
    await upstream.aclose()


async def _until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


class Paused:
    """The warmer's sleep, held by the test: records each delay, returns when released."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.release = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await self.release.wait()


class Direct:
    """A Warmer in this event loop, on the engine, fed turns the way the tracker feeds it."""

    def __init__(
        self,
        engine: Engine,
        sleep: Callable[[float], Any] | None = None,
        *,
        metrics_every: float = 0.5,  # how often the engine's /metrics is read
    ) -> None:
        settings = config.load({"upstream": engine.url}, environ={})
        self.registry = CollectorRegistry()
        self.upstream = Upstream(settings)
        self.now = 1000.0
        self.sleep = Paused()
        self.warmer = Warmer(
            settings,
            self.upstream,
            Metrics(self.registry),
            in_flight=lambda: 0,
            monitor=EngineMonitor(self.upstream.call, interval=metrics_every),
            clock=lambda: self.now,
            wall=lambda: self.now,
            sleep=sleep or self.sleep,
        )
        self.session = Session("s1")

    def reply(
        self,
        messages: list,
        reply: dict,
        *,
        arrived: float,
        after_tools: bool,
        usage: dict | None = None,
    ) -> None:
        """A recorded reply to a request that arrived at ``arrived`` (the warmer's clock),
        with the usage the engine gave that request."""
        turn = Turn(self.session, messages, [], forwarded_messages=messages)
        turn.request = {"model": MODEL, "messages": messages, "tools": TOOLS}
        turn.follows_tool_calls = after_tools
        exchange = Exchange(
            "/v1/chat/completions", "POST", started=arrived, reply=reply, usage=usage
        )
        self.now = arrived + 0.5  # the reply is recorded half a second after its request
        self.warmer.after_reply(turn, exchange)

    def sample(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def sent(self, trigger: str) -> float:
        return self.sample("prefill_proxy_warmups_total", trigger=trigger, outcome="ok")

    def outcomes(self) -> dict[str, float]:
        """Every warm-up count so far, sent or skipped, by its labels (for a failure)."""
        prefixes = ("prefill_proxy_warmups_total", SKIPPED)
        return {
            f"{sample.name}{sample.labels}": sample.value
            for metric in self.registry.collect()
            for sample in metric.samples
            if sample.name.startswith(prefixes) and sample.value
        }

    async def close(self) -> None:
        await self.warmer.aclose()
        await self.upstream.aclose()


@pytest.fixture
async def direct(engine) -> AsyncIterator[Direct]:
    direct = Direct(engine)
    yield direct
    await direct.close()


@pytest.mark.anyio
async def test_a_second_warmup_goes_just_before_the_client_is_expected_back(engine, direct) -> None:
    messages, reply, _ = aligned_step(engine, "timed")
    second = [*messages, reply, tool_result()]
    direct.reply(messages, reply, arrived=1000.0, after_tools=False)
    await _until(lambda: direct.sent("tool_calls") == 1)
    assert direct.sleep.delays == []  # no tool round seen yet: nothing to time
    # The client came back 3 s after the reply: its next tool round is expected as long.
    direct.reply(second, reply, arrived=1003.5, after_tools=True)
    await _until(lambda: direct.sleep.delays == [2.7])  # a tenth of the round early
    assert direct.sent("tool_calls") == 2 and direct.sent("tool_calls_timed") == 0
    direct.sleep.release.set()
    await _until(lambda: direct.sent("tool_calls_timed") == 1)
    # The timed one sends the tokens the first /tokenize gave: no second rendering.
    assert engine.gate.paths.count("/tokenize") == 2
    assert engine.gate.completions[-1] == engine.gate.completions[-2]


@pytest.mark.anyio
async def test_no_warmup_after_a_reply_whose_tool_round_was_short(engine, direct) -> None:
    """Back within a second: the reply's blocks are still cached when the client returns,
    and a warm-up would run into its request. A long round warms again."""
    messages, reply, _ = aligned_step(engine, "short")
    direct.reply(messages, reply, arrived=1000.0, after_tools=False)
    await _until(lambda: direct.sent("tool_calls") == 1)  # no round seen yet: warmed
    # The reply is recorded at arrived + 0.5: the client is back 0.6 s later.
    direct.reply(messages, reply, arrived=1001.1, after_tools=True)
    assert direct.sample(SKIPPED, reason="short_round") == 1
    direct.reply(messages, reply, arrived=1004.6, after_tools=True)  # a 3 s round
    await _until(lambda: direct.sent("tool_calls") == 2)
    assert direct.sample(SKIPPED, reason="short_round") == 1
    assert direct.sleep.delays == []  # a round under a second in view: nothing timed


@pytest.mark.anyio
async def test_no_timed_warmup_for_rounds_that_vary_too_widely(engine, direct) -> None:
    """Rounds of 2 s and 7 s: aimed at the shortest, a timed warm-up would come 5 s early
    for the long ones, and their blocks go again before the step. The warm-up right after
    each reply still goes."""
    messages, reply, _ = aligned_step(engine, "irregular")
    direct.reply(messages, reply, arrived=1000.0, after_tools=False)
    await _until(lambda: direct.sent("tool_calls") == 1)
    direct.reply(messages, reply, arrived=1002.5, after_tools=True)  # a 2 s round
    await _until(lambda: direct.sleep.delays == [1.8] and direct.sent("tool_calls") == 2)
    direct.reply(messages, reply, arrived=1010.0, after_tools=True)  # then a 7 s one
    await _until(lambda: direct.sent("tool_calls") == 3)
    assert direct.sample(SKIPPED, reason="irregular_rounds") == 1
    assert direct.sleep.delays == [1.8]  # nothing timed after the second round


@pytest.mark.anyio
async def test_no_timed_warmup_once_the_client_is_back(engine, direct) -> None:
    messages, reply, _ = aligned_step(engine, "back")
    direct.reply(messages, reply, arrived=1000.0, after_tools=False)
    await _until(lambda: direct.sent("tool_calls") == 1)
    direct.reply(messages, reply, arrived=1003.5, after_tools=True)
    await _until(lambda: direct.sleep.delays == [2.7] and direct.sent("tool_calls") == 2)
    direct.warmer.client_back("s1")  # the tracker, when the next request opens the session
    direct.sleep.release.set()
    await _until(lambda: direct.sample(SKIPPED, reason="client_back") == 1)
    assert direct.sent("tool_calls_timed") == 0


@pytest.mark.anyio
async def test_a_newer_reply_replaces_the_timed_warmup_and_shutdown_ends_it(engine, direct) -> None:
    messages, reply, _ = aligned_step(engine, "replaced")
    direct.reply(messages, reply, arrived=1000.0, after_tools=False)
    await _until(lambda: direct.sent("tool_calls") == 1)
    direct.reply(messages, reply, arrived=1003.5, after_tools=True)
    await _until(lambda: len(direct.sleep.delays) == 1 and direct.sent("tool_calls") == 2)
    direct.reply(messages, reply, arrived=1005.0, after_tools=True)  # rounds: 3.0 s, 1.0 s
    await _until(lambda: direct.sleep.delays == [2.7, 0.8] and direct.sent("tool_calls") == 3)
    waiting = direct.warmer.running()
    assert len(waiting) == 1  # the first timed one was cancelled by the newer reply
    await direct.warmer.aclose()
    assert waiting[0].cancelled()
    direct.sleep.release.set()
    assert direct.sent("tool_calls_timed") == 0


@pytest.mark.anyio
async def test_a_timed_warmup_waits_out_a_busy_engine_until_the_client_is_due(engine) -> None:
    busy = b'vllm:num_requests_waiting{engine="0"} 3.0\n'
    engine.gate.metrics = busy
    delays: list[float] = []

    async def sleep(seconds: float) -> None:
        delays.append(seconds)
        if seconds == RETRY_S:  # the engine drains before the retry
            engine.gate.metrics = b'vllm:num_requests_waiting{engine="0"} 0.0\n'
            scrapes = engine.gate.paths.count("/metrics")
            # The poller reads one scrape at a time: once a second one has started, the
            # first one after the drain has been read and stored.
            await _until(lambda: engine.gate.paths.count("/metrics") > scrapes + 1)

    direct = Direct(engine, sleep)
    messages, reply, _ = aligned_step(engine, "waited")
    engine.gate.metrics = busy
    direct.reply(messages, reply, arrived=1000.0, after_tools=False)
    await _until(lambda: direct.sample(SKIPPED, reason="engine_busy") == 1)
    direct.reply(messages, reply, arrived=1003.5, after_tools=True)  # skipped again at once
    await _until(lambda: direct.sent("tool_calls_timed") == 1)
    assert delays == [2.7, RETRY_S]  # 0.3 s to go when it was due: room for one retry
    assert direct.sample(SKIPPED, reason="engine_busy") == 2
    await direct.close()


@pytest.mark.anyio
async def test_a_timed_warmup_gives_up_when_the_engine_stays_busy(engine) -> None:
    engine.gate.metrics = b'vllm:num_requests_waiting{engine="0"} 3.0\n'
    delays: list[float] = []

    async def sleep(seconds: float) -> None:
        delays.append(seconds)

    direct = Direct(engine, sleep)
    messages, reply, _ = aligned_step(engine, "gave-up")
    direct.reply(messages, reply, arrived=1000.0, after_tools=False)
    await _until(lambda: direct.sample(SKIPPED, reason="engine_busy") == 1)
    direct.reply(messages, reply, arrived=1010.5, after_tools=True)  # a 10 s round
    await _until(lambda: direct.sample(SKIPPED, reason="engine_busy") == 3)
    assert delays == [9.0] + [RETRY_S] * 4  # one second early, then until it is due
    assert direct.sent("tool_calls_timed") == 0
    await direct.close()


async def _timed_rounds(direct: Direct, engine: Engine, tag: str, rounds: int) -> None:
    """``rounds`` tool rounds of 3 s, each waited out until its timed warm-up is done or
    skipped (a newer reply would cancel it)."""
    messages, reply, _ = aligned_step(engine, tag)
    direct.reply(messages, reply, arrived=1000.0, after_tools=False)
    await _until(lambda: direct.sent("tool_calls") == 1)
    for n in range(1, rounds + 1):
        direct.reply(messages, reply, arrived=1000.0 + 3.5 * n, after_tools=True)
        # The round's warm-up settled, then judged: an outcome other than these two fails
        # here and says which, where waiting for these would only time out.
        async with asyncio.timeout(10.0):
            await asyncio.gather(*direct.warmer.running(), return_exceptions=True)
        settled = direct.sent("tool_calls_timed") + direct.sample(SKIPPED, reason="still_cached")
        assert settled == n, f"round {n}: {direct.outcomes()}"


@pytest.mark.anyio
async def test_timed_warmups_that_keep_finding_their_prefix_cached_mostly_stop(engine) -> None:
    async def sleep(seconds: float) -> None:
        pass

    direct = Direct(engine, sleep)
    await _timed_rounds(direct, engine, "roomy", CACHED_STREAK + 2 * PROBE_EVERY)
    # A roomy engine: every timed warm-up found its blocks still cached. After a streak of
    # them, one in PROBE_EVERY goes.
    assert direct.sent("tool_calls_timed") == CACHED_STREAK + 2
    assert direct.sample(SKIPPED, reason="still_cached") == 2 * (PROBE_EVERY - 1)
    await direct.close()


@pytest.mark.anyio
async def test_timed_warmups_that_recompute_evicted_blocks_all_go(engine) -> None:
    async def sleep(seconds: float) -> None:
        # Other sessions' traffic evicts this one's blocks during its tool round.
        async with httpx.AsyncClient() as client:
            (await client.post(engine.url + "/reset_prefix_cache")).raise_for_status()

    direct = Direct(engine, sleep)
    await _timed_rounds(direct, engine, "evicted", CACHED_STREAK + PROBE_EVERY)
    assert direct.sent("tool_calls_timed") == CACHED_STREAK + PROBE_EVERY
    assert direct.sample(SKIPPED, reason="still_cached") == 0
    await direct.close()


@pytest.mark.anyio
async def test_timed_warmups_evicted_before_their_step_mostly_stop(engine) -> None:
    async def reset() -> None:
        async with httpx.AsyncClient() as client:
            (await client.post(engine.url + "/reset_prefix_cache")).raise_for_status()

    async def sleep(seconds: float) -> None:
        await reset()  # the tool round evicts the blocks: the timed warm-up recomputes them

    direct = Direct(engine, sleep)
    messages, reply, count = aligned_step(engine, "thrash")
    step = {"model": MODEL, "messages": [*messages, reply, tool_result()], "tools": TOOLS}
    direct.reply(messages, reply, arrived=1000.0, after_tools=False)
    await _until(lambda: direct.sent("tool_calls") == 1)
    usage = None
    for n in range(1, CACHED_STREAK + PROBE_EVERY + 1):
        direct.reply(messages, reply, arrived=1000.0 + 3.5 * n, after_tools=True, usage=usage)
        # Each reply's two warm-ups (right after it, then timed) went or were skipped.
        await _until(
            lambda n=n: (
                direct.sent("tool_calls")
                + direct.sent("tool_calls_timed")
                + direct.sample(SKIPPED, reason="evicted_before_use")
                == 2 * n + 1
            )
        )
        # ... and evicted again before the step comes, which the engine then recomputes.
        await reset()
        async with httpx.AsyncClient() as client:
            answer = await client.post(engine.url + "/v1/chat/completions", json=step)
        usage = answer.json()["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] < count - 1
    # The first CACHED_STREAK were all missed: then one timed warm-up in PROBE_EVERY goes,
    # and none right after a reply (its blocks would be evicted before the step as well).
    assert direct.sent("tool_calls_timed") == CACHED_STREAK + 1
    assert direct.sent("tool_calls") == CACHED_STREAK + 1
    assert direct.sample(SKIPPED, reason="evicted_before_use") == 2 * PROBE_EVERY - 1
    await direct.close()


@pytest.mark.anyio
@pytest.mark.parametrize(("waiting", "sent"), [(3, 0), (0, 1)])
async def test_no_warmup_while_the_engine_keeps_queueing(engine, waiting: int, sent: int) -> None:
    """An engine whose recent /metrics readings all said it queued requests has no idle
    time for a warm-up to use; one that queued none does."""
    engine.gate.metrics = b'vllm:num_requests_waiting{engine="0"} %d.0\n' % waiting
    direct = Direct(engine, metrics_every=0.01)
    messages, reply, _ = aligned_step(engine, f"queued-{waiting}")
    # The first warm-up finds the engine queueing (engine_busy) or not: too few readings
    # yet to call it saturated.
    direct.reply(messages, reply, arrived=990.0, after_tools=False)
    await _until(
        lambda: direct.sent("tool_calls") + direct.sample(SKIPPED, reason="engine_busy") == 1
    )
    await _until(lambda: engine.gate.paths.count("/metrics") > QUEUE_MIN_READINGS)
    direct.reply(messages, reply, arrived=1000.0, after_tools=False)
    assert direct.sample(SKIPPED, reason="engine_saturated") == 1 - sent
    await _until(lambda: direct.sent("tool_calls") == 2 * sent)
    share = direct.sample("prefill_proxy_engine_queued_share", engine=engine.url)
    assert share == 1 - sent
    await direct.close()
