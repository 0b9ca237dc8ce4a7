"""``prefill-proxy replay``: the command line. Imported when the CLI builds its parser, so
the replay's machinery (httpx, the generator, matplotlib) loads only in ``run``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from proxy.replay.profiles import PROFILES, TRIM_TOKENS
from proxy.replay.traces import BUNDLED, locate

if TYPE_CHECKING:
    from proxy.replay.benchmark import Config

DESCRIPTION = """Replay agent conversations step by step against an OpenAI-compatible
server and measure, per step, prompt tokens, cached tokens (usage.prompt_tokens_details),
time to first token and end-to-end time. Each step sends the recorded history (see
proxy/replay/bundled/README.md), streamed with usage, and the recorded answer in the extension
field x_replay_reply (the simulator streams it back; vLLM ignores it). Exit status: 0 all
steps succeeded, 1 some failed, 2 the replay could not run."""

PROFILE_HELP = """how the client treats the prompt: faithful (as recorded), timestamped
(date and time at the top of the system prompt, every request), reordered-tools (tool list
in another order every request), reserialized-args (tool-call arguments sent back in the
other JSON style), dropped-reasoning (reasoning removed from assistant messages), mixed
(all of them), client-trim (the client keeps the system prompt and its newest messages
within --trim-tokens, starting on a user message, as LangChain's trim_messages does)"""


class OptionError(ValueError):
    """Options that parse one by one but do not go together."""


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--traces",
        type=locate,
        metavar="FILE",
        help="JSONL agent traces: a path, or the name of a bundled set ("
        + ", ".join(sorted(BUNDLED))
        + ": 60 real tau-bench conversations, 688 model calls)",
    )
    source.add_argument(
        "--synthetic",
        type=_positive_int,
        metavar="N",
        help="replay N generated conversations instead of traces (see --seed)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of --synthetic (default 0)")
    parser.add_argument(
        "--steps",
        type=_positive_int,
        metavar="N",
        help="with --synthetic: about N model calls per conversation (default: 8 to 14 "
        "each, like the recorded traces); e.g. 120 for long sessions",
    )
    parser.add_argument(
        "--target", required=True, metavar="URL", help="server base URL, e.g. vLLM's"
    )
    parser.add_argument(
        "--compare",
        metavar="PROXY_URL",
        help="replay straight at --target, then through this proxy; show both and the difference",
    )
    parser.add_argument(
        "--profile", choices=sorted(PROFILES), default="faithful", help=PROFILE_HELP
    )
    parser.add_argument(
        "--trim-tokens",
        type=_positive_int,
        metavar="N",
        help="with --profile client-trim: message tokens the client keeps, system prompt "
        f"included, tools not counted (tiktoken o200k_base; default {TRIM_TOKENS})",
    )
    parser.add_argument(
        "--concurrency",
        type=_positive_int,
        default=1,
        metavar="N",
        help="conversations in flight (default 1)",
    )
    parser.add_argument(
        "--tool-latency",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="pause before each step that follows tool results, as the client runs its "
        "tools (default 0)",
    )
    parser.add_argument("--limit", type=_positive_int, metavar="N", help="first N conversations")
    parser.add_argument("--model", help="model name (default: the first of GET /v1/models)")
    parser.add_argument(
        "--max-tokens", type=_positive_int, metavar="N", help="send max_tokens=N on each step"
    )
    reset = parser.add_mutually_exclusive_group()
    reset.add_argument(
        "--reset-cache",
        metavar="URL",
        help="POST URL/reset_prefix_cache before each run, so each starts cold (vLLM "
        "serves it with VLLM_SERVER_DEV_MODE=1); with --compare the default is --target",
    )
    reset.add_argument(
        "--no-reset-cache", action="store_true", help="with --compare, do not reset the cache"
    )
    parser.add_argument("--json", type=Path, metavar="OUT", help="write steps and summary here")
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="OUT.png",
        help="draw TTFT and cached share by step index (needs prefill-proxy[bench])",
    )
    parser.add_argument(
        "--progress",
        action="store_true",
        help="show progress on stderr even when it is not a terminal",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=600.0,
        metavar="SECONDS",
        help="longest wait for bytes from the server (default 600)",
    )
    parser.add_argument("--api-key", help="sent as a bearer token")
    parser.add_argument(
        "--api",
        choices=("chat", "responses"),
        default="chat",
        help="the wire format the replayed client speaks: chat completions (default) or "
        "the Responses API (/v1/responses: instructions, input items, typed events)",
    )
    parser.add_argument(
        "--echo-replies",
        action="store_true",
        help="send back the replies the engine gave instead of the recorded ones, as an "
        "agent does (chat only; a real model's replies differ from the trace's)",
    )


def to_config(args: argparse.Namespace) -> Config:
    from proxy.replay.benchmark import Config

    if args.steps is not None and args.synthetic is None:
        raise OptionError("--steps needs --synthetic")
    if args.trim_tokens is not None and args.profile != "client-trim":
        raise OptionError("--trim-tokens needs --profile client-trim")
    if args.echo_replies and args.api != "chat":
        raise OptionError("--echo-replies works with --api chat only")
    reset = args.reset_cache
    if reset is None and args.compare and not args.no_reset_cache:
        reset = args.target  # both runs start cold, so neither inherits the other's cache
    return Config(
        target=args.target,
        traces=args.traces,
        synthetic=args.synthetic,
        seed=args.seed,
        synthetic_steps=args.steps,
        limit=args.limit,
        compare=args.compare,
        profile=args.profile,
        concurrency=args.concurrency,
        tool_latency=args.tool_latency,
        model=args.model,
        max_tokens=args.max_tokens,
        trim_tokens=args.trim_tokens,
        reset_cache=reset,
        json_path=args.json,
        plot_path=args.plot,
        progress=args.progress or sys.stderr.isatty(),
        timeout=args.timeout,
        api_key=args.api_key,
        api=args.api,
        echo_replies=args.echo_replies,
    )


def run(args: argparse.Namespace) -> int:
    import asyncio

    from proxy.replay.benchmark import execute

    try:
        config = to_config(args)
    except OptionError as exc:
        sys.stderr.write(f"prefill-proxy replay: {exc}\n")
        return 2
    try:
        return asyncio.run(execute(config, sys.stdout, sys.stderr))
    except BrokenPipeError:
        # stdout's reader left (| head); the files are written: end quietly, and keep
        # Python's final flush from failing again (docs.python.org/3/library/signal.html,
        # "Note on SIGPIPE").
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
