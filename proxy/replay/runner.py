"""Replaying conversations against a server: one step after another per conversation,
several conversations in flight, each step timed from the client's side.

The only module of the replay that does network I/O; httpx errors stop here and become a
step's error (the run goes on) or a ReplayError (the run cannot start).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx

from proxy import jsonio
from proxy.replay import profiles, request
from proxy.replay.records import Run, StepRecord
from proxy.replay.response import (
    COMPACTION_HEADER,
    OVERHEAD_HEADER,
    StreamObserver,
    error_message,
    overhead_ms,
    token_counts,
)
from proxy.replay.traces import Conversation, Step, steps

API_PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses"}


class ReplayError(RuntimeError):
    """The replay cannot run (no model to use, a cache reset refused)."""


@dataclasses.dataclass(frozen=True)
class Options:
    model: str
    profile: str = "faithful"
    concurrency: int = 1
    tool_latency: float = 0.0  # seconds the client "runs tools" before a step after tools
    # When set, each tool round takes a time drawn from tool_latency..tool_latency_max
    # instead, the same for a given conversation and step in every run (off vs on).
    tool_latency_max: float | None = None
    # Send back the replies the engine gave instead of the recorded ones (chat only), as an
    # agent does: what a real model answers differs from the trace, unlike the simulator's.
    echo_replies: bool = False
    # The first conversations in flight start spread evenly over this many seconds rather
    # than at once (sessions that all start together stay in lockstep for a while).
    start_spread: float = 0.0
    max_tokens: int | None = None
    trim_tokens: int | None = None  # client-trim's budget (default: profiles.TRIM_TOKENS)
    api: str = "chat"  # the wire format: "chat" (completions) or "responses"


def make_client(concurrency: int, timeout: float, api_key: str | None = None) -> httpx.AsyncClient:
    """One client for the whole replay, a connection per conversation in flight."""
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.AsyncClient(
        limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        timeout=httpx.Timeout(timeout, connect=10.0, pool=None),
        headers=headers,
    )


class Replayer:
    def __init__(
        self,
        client: httpx.AsyncClient,
        target: str,
        options: Options,
        *,
        on_step: Callable[[StepRecord], None] | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._client = client
        self._url = target.rstrip("/") + API_PATHS[options.api]
        self._options = options
        self._profile = profiles.select(options.profile, trim_tokens=options.trim_tokens)
        self._on_step = on_step
        self._sleep = sleep
        self._clock = clock

    async def run(self, conversations: Sequence[Conversation]) -> Run:
        started = self._clock()
        results: dict[int, list[StepRecord]] = {}
        pending = iter(enumerate(conversations))

        workers = min(max(self._options.concurrency, 1), len(conversations))

        async def worker(number: int) -> None:
            if self._options.start_spread > 0 and number:
                await self._sleep(self._options.start_spread * number / workers)
            for index, conversation in pending:  # shared: each worker takes the next one
                results[index] = await self._conversation(conversation)

        await asyncio.gather(*(worker(number) for number in range(workers)))
        records = [record for index in sorted(results) for record in results[index]]
        return Run(records, self._clock() - started)

    async def _conversation(self, conversation: Conversation) -> list[StepRecord]:
        records = []
        emitted: dict[int, dict[str, Any]] = {}  # trace position -> the engine's reply
        for step in steps(conversation):
            wait = tool_round(self._options, step) if step.after_tool else 0.0
            if wait > 0:
                await self._sleep(wait)
            record = await self._step(step, emitted)
            records.append(record)
            if self._on_step is not None:
                self._on_step(record)
        return records

    async def _step(self, step: Step, emitted: dict[int, dict[str, Any]]) -> StepRecord:
        options = self._options
        body = request.build(step, self._profile, options.model, options.max_tokens, emitted)
        record = StepRecord(step.conversation.id, step.index, len(body["messages"]))
        if options.api == "responses":
            body = request.as_responses(body)
        observer = StreamObserver(assemble=options.echo_replies)
        content = jsonio.dumps(body)
        started = self._clock()
        try:
            async with self._client.stream(
                "POST", self._url, content=content, headers={"content-type": "application/json"}
            ) as response:
                record.status = response.status_code
                record.compaction = response.headers.get(COMPACTION_HEADER)
                record.proxy_overhead_ms = overhead_ms(response.headers.get(OVERHEAD_HEADER))
                if response.status_code >= 400:
                    record.error = _body_error(await response.aread())
                    return record
                async for chunk in response.aiter_bytes():
                    observer.feed(chunk, self._clock())
        except httpx.HTTPError as exc:
            record.error = f"{type(exc).__name__}: {exc}".rstrip(": ")
            return record
        ended = self._clock()
        observer.close(ended)
        record.error = observer.error
        record.e2e_s = ended - started
        if observer.first_token_at is not None:
            record.ttft_s = observer.first_token_at - started
        record.prompt_tokens, record.cached_tokens = token_counts(observer.usage)
        if observer.reply is not None and record.error is None:
            emitted[step.position] = observer.reply
        return record


def tool_round(options: Options, step: Step) -> float:
    """Seconds the client runs its tools before ``step`` (one that answers tool calls)."""
    low, high = options.tool_latency, options.tool_latency_max
    if high is None or high <= low:
        return low
    return random.Random(f"{step.conversation.id}:{step.index}").uniform(low, high)


def _body_error(body: bytes) -> str:
    try:
        return error_message(jsonio.loads(body))
    except jsonio.InvalidJSON:
        return body.decode("utf-8", "replace")[:500] or "(empty body)"


async def discover_model(client: httpx.AsyncClient, target: str) -> str:
    """The first model the server lists at /v1/models."""
    url = target.rstrip("/") + "/v1/models"
    try:
        response = await client.get(url)
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise ReplayError(f"cannot find a model at {url} ({exc}); give --model") from exc


async def reset_prefix_cache(client: httpx.AsyncClient, base: str) -> None:
    """Empty the engine's prefix cache, so that a run starts cold."""
    url = base.rstrip("/") + "/reset_prefix_cache"
    try:
        response = await client.post(url)
    except httpx.HTTPError as exc:
        raise ReplayError(f"cannot reset the prefix cache at {url}: {exc}") from exc
    if response.status_code >= 400:
        # vLLM serves this endpoint only with VLLM_SERVER_DEV_MODE=1.
        raise ReplayError(
            f"POST {url} answered {response.status_code}: start vLLM with "
            "VLLM_SERVER_DEV_MODE=1, or run without --reset-cache (--no-reset-cache)"
        )
