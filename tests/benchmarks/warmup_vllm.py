"""Speculative prefill on real vLLM (CPU build, the tiny test model): a few dev-trace
conversations run as live agent loops through the proxy, warm-up on vs off, with a KV
cache small enough that they evict each other.

The replay benchmark cannot do this on vLLM: it sends the recorded history, while the
proxy warms the reply vLLM emitted (and a random model emits no tool calls). Here each
step's reply is scripted with structured outputs (the recorded reply in Hermes form, as
``choice``), the client keeps the reply it got and sends the recorded tool results after
a tool latency: the loop a real agent runs. Text replies are cut to ``--max-text``
characters (decoding is slow on a CPU). TTFT here is the time to the stream's first chunk:
vLLM sends the role chunk with the first token, while the Hermes parser holds a tool
call's deltas back until its name is decoded (a second or two of decoding on a CPU, which
would drown the prefill). One vLLM for both modes, its prefix cache reset in between.

    .venv/bin/python -m tests.benchmarks.warmup_vllm                      # starts vLLM
    .venv/bin/python -m tests.benchmarks.warmup_vllm --engine http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from proxy.background import free_port, spawn
from proxy.chunks import ReplyAssembler
from proxy.replay import traces
from proxy.replay.records import StepRecord
from tests.benchmarks.warmup import TRACES, metric, scrape, summary, table

BLOCK = 32  # tests/vllm/serve.sh


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--engine", help="a running vLLM (VLLM_SERVER_DEV_MODE=1); default: start one")
    add("--traces", type=Path, default=TRACES)
    add(
        "--source",
        default="each",
        help="conversations of this source (sharing its system prompt and tools), or 'each' "
        "(default): every source in turn",
    )
    add("--conversations", type=int, default=3, help="how many (default 3)")
    add(
        "--max-chars",
        type=int,
        default=14_000,
        help="of those within this many characters of history, the ones with the most tool "
        "rounds (default 14000: up to ~11.5k tokens with the test model)",
    )
    add("--steps", type=int, default=14, help="model calls per conversation (default 14)")
    add("--tool-latency", type=float, default=8.0, help="seconds per tool round (default 8)")
    add("--kv-blocks", type=int, default=448, help="vLLM KV blocks of 32 tokens (default 448)")
    add("--max-model-len", type=int, default=12288)
    add("--max-text", type=int, default=80, help="characters of a text reply kept")
    add("--cold-tokens", type=int, default=2048, help="computed tokens that mean prefix lost")
    add("--modes", default="off,on")
    add("--steps-out", type=Path, help="also write each step (JSON lines) to this file")
    add(
        "--priority",
        type=int,
        default=0,
        help="start vLLM with --scheduling-policy priority and send warm-ups at this "
        "priority (warmup_priority; higher runs later); 0: FCFS (default)",
    )
    return parser.parse_args(argv)


def tool_rounds(conversation: traces.Conversation) -> int:
    return sum(step.after_tool for step in traces.steps(conversation))


def choose(args: argparse.Namespace) -> list[traces.Conversation]:
    every = [
        c for c in traces.load(args.traces) if len(json.dumps(c.messages[1:])) <= args.max_chars
    ]
    every.sort(key=tool_rounds, reverse=True)
    if args.source != "each":
        return [c for c in every if c.source == args.source][: args.conversations]
    sources = sorted({c.source for c in every})
    by_source = [[c for c in every if c.source == source] for source in sources]
    mixed = [c for rank in zip(*by_source, strict=False) for c in rank]
    return mixed[: args.conversations]


def scripted(reply: dict[str, Any], max_text: int) -> str:
    """The recorded reply as the model would write it in the Hermes template."""
    parts = [reply["content"][:max_text]] if reply.get("content") else []
    for call in reply.get("tool_calls") or ():
        function = call["function"]
        arguments = json.loads(function.get("arguments") or "{}")
        body = json.dumps({"name": function["name"], "arguments": arguments})
        parts.append(f"<tool_call>\n{body}\n</tool_call>")
    return "\n".join(parts) or "OK"


class Agent:
    """One conversation as a live loop: the reply it gets is the history it sends next."""

    def __init__(self, client: httpx.AsyncClient, proxy: str, model: str, args: Any) -> None:
        self.client, self.proxy, self.model, self.args = client, proxy, model, args

    async def run(self, conversation: traces.Conversation) -> list[tuple[bool, StepRecord]]:
        history: list[dict[str, Any]] = []
        ids: dict[str, str] = {}  # recorded tool-call id -> the one vLLM emitted
        done, records = 0, []
        steps = traces.steps(conversation)[: self.args.steps]
        for step in steps:
            for message in conversation.messages[done : step.position]:
                if message.get("role") == "tool":
                    message = {**message, "tool_call_id": ids.get(message["tool_call_id"], "")}
                history.append(message)
            if step.after_tool:
                await asyncio.sleep(self.args.tool_latency)
            record = StepRecord(conversation.id, step.index, len(history))
            # The last step answers in text, as a finished session does: tool calls there
            # would leave a warm-up for a step that never comes (warmup.truncate).
            script = scripted(step.reply, self.args.max_text) if step is not steps[-1] else "Done."
            reply = await self._step(conversation, history, script, record)
            recorded = step.reply.get("tool_calls") or []
            emitted = reply.get("tool_calls") or []
            ids.update({r["id"]: e["id"] for r, e in zip(recorded, emitted, strict=False)})
            history.append(reply)
            done = step.position + 1
            records.append((step.after_tool, record))
        return records

    async def _step(
        self, conversation: traces.Conversation, history: list, script: str, record: StepRecord
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": history}
        body["tools"] = conversation.tools
        body |= {"tool_choice": "auto", "temperature": 0, "max_tokens": 1024}
        body |= {"stream": True, "stream_options": {"include_usage": True}}
        body["structured_outputs"] = {"choice": [script]}
        assembler, usage = ReplyAssembler(), None
        started = time.perf_counter()
        async with self.client.stream(
            "POST", self.proxy + "/v1/chat/completions", json=body
        ) as response:
            record.status = response.status_code
            if response.status_code != 200:
                record.error = (await response.aread()).decode()[:300]
                return {"role": "assistant", "content": ""}
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                payload = json.loads(line[6:])
                if record.ttft_s is None:  # the role chunk: vLLM sends it with the first token
                    record.ttft_s = time.perf_counter() - started
                assembler.feed(payload)
                usage = payload.get("usage") or usage
        record.e2e_s = time.perf_counter() - started
        if usage:
            record.prompt_tokens = usage["prompt_tokens"]
            details = usage.get("prompt_tokens_details") or {}
            record.cached_tokens = details.get("cached_tokens") or 0
        return assembler.message()


@contextlib.contextmanager
def vllm(args: argparse.Namespace) -> Iterator[str]:
    if args.engine:
        yield args.engine
        return
    from tests.support import vllm as support

    extra = ["--num-gpu-blocks-override", str(args.kv_blocks)]
    extra += ["--max-model-len", str(args.max_model_len)]
    if args.priority:
        extra += ["--scheduling-policy", "priority"]
    log = Path(tempfile.mkdtemp(prefix="warmup-vllm-")) / "vllm.log"
    with support.start(support.free_port(), log, extra_args=extra) as server:
        yield server.base_url


@contextlib.contextmanager
def proxy_for(engine: str, warmup: bool, priority: int = 0) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    serve = ["proxy", "serve", "--upstream", engine, "--port", str(port), "--log-level", "warning"]
    # These prompts (6-8k tokens) cross compaction's watermarks at an 8k context: compaction
    # would summarize them (on the tiny model) and hold steps for it, which is not measured.
    serve += ["--compaction", "false", "--warmup", str(warmup).lower()]
    if priority:
        serve += ["--warmup-priority", str(priority)]
    with spawn(serve, url + "/ready"):
        yield url


async def run_mode(
    args: argparse.Namespace, engine: str, warmup: bool, conversations: list
) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=600) as client:
        (await client.post(engine + "/reset_prefix_cache")).raise_for_status()
        model = (await client.get(engine + "/v1/models")).json()["data"][0]["id"]
        before = metric(scrape(engine), "vllm:prompt_tokens_by_source_total", "local_compute")
        with proxy_for(engine, warmup, args.priority) as proxy:
            started = time.monotonic()
            agent = Agent(client, proxy, model, args)
            runs = await asyncio.gather(*(agent.run(c) for c in conversations))
            wall = time.monotonic() - started
            proxy_text = scrape(proxy)
        after = metric(scrape(engine), "vllm:prompt_tokens_by_source_total", "local_compute")
    records = [pair for run in runs for pair in run]
    steps = [record for _, record in records]
    followers = [record for after_tool, record in records if after_tool]
    if args.steps_out:
        with args.steps_out.open("a") as out:
            for after_tool, record in records:
                step = {"warmup": warmup, "after_tool": after_tool, **dataclasses.asdict(record)}
                out.write(json.dumps(step) + "\n")
    return summary(warmup, steps, followers, after - before, proxy_text, wall, args.cold_tokens)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    conversations = choose(args)
    print(
        f"{len(conversations)} conversations of {args.source} (most tool rounds), up to "
        f"{args.steps} steps each, all at once; tool latency {args.tool_latency} s; vLLM CPU "
        f"KV {args.kv_blocks} blocks x {BLOCK} tokens\n",
        flush=True,
    )
    results = []
    with vllm(args) as engine:
        for mode in args.modes.split(","):
            results.append(asyncio.run(run_mode(args, engine, mode == "on", conversations)))
            print(f"{mode}: done in {results[-1]['wall']:.0f} s", file=sys.stderr, flush=True)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
