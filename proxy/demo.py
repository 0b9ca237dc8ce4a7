"""``prefill-proxy demo``: the simulator, the proxy in front of it, and synthetic agents
replayed straight at the engine and through the proxy. No GPU, no network, about a minute.

Imported when the CLI builds its parser: the machinery loads only in ``run``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

DESCRIPTION = """Start the vLLM-like simulator (modelling Llama-3.1-8B on one H100) and the
proxy in front of it on loopback ports, generate synthetic agent conversations (support
desks with 14 tools, ~12 model calls each), replay them straight at the engine and then
through the proxy (the engine's prefix cache is reset in between), and print the
comparison: prefill tokens computed, cached share, TTFT by step. The default client
profile, mixed, does what real agent frameworks do to a prompt (a clock in the system
prompt, tools in another order, re-serialized tool arguments)."""


def configure(parser: argparse.ArgumentParser) -> None:
    from proxy.replay.profiles import PROFILES

    parser.description = DESCRIPTION
    parser.add_argument("--conversations", type=int, default=4, help="how many (default 4)")
    parser.add_argument(
        "--concurrency", type=int, default=4, help="conversations in flight (default 4)"
    )
    parser.add_argument(
        "--profile", choices=sorted(PROFILES), default="mixed", help="client profile"
    )
    parser.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="simulated engine speed-up (default 1: the modelled GPU's own times)",
    )
    parser.add_argument(
        "--tool-latency", type=float, default=0.2, help="seconds a tool takes (default 0.2)"
    )
    parser.add_argument("--seed", type=int, default=0, help="conversation generator seed")
    parser.add_argument(
        "--out", type=Path, default=None, help="folder for demo.json and demo.png (default: temp)"
    )


def run(args: argparse.Namespace) -> int:
    import asyncio

    from proxy.replay import benchmark

    out = args.out or Path(tempfile.mkdtemp(prefix="prefill-proxy-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    with simulator_and_proxy(args.speed) as (engine, proxy_url):
        sys.stderr.write(f"simulator {engine}, proxy {proxy_url}\n")
        replay = benchmark.Config(
            target=engine,
            compare=proxy_url,
            reset_cache=engine,
            synthetic=args.conversations,
            seed=args.seed,
            profile=args.profile,
            concurrency=args.concurrency,
            tool_latency=args.tool_latency,
            json_path=out / "demo.json",
            plot_path=out / "demo.png" if _can_plot() else None,
            progress=sys.stderr.isatty(),
        )
        return asyncio.run(benchmark.execute(replay, sys.stdout, sys.stderr))


@contextlib.contextmanager
def simulator_and_proxy(speed: float, engine: str | None = None) -> Iterator[tuple[str, str]]:
    """The simulator (unless ``engine`` is given) and the proxy in front of it, each in its
    own process as deployed: sharing the caller's interpreter (and its GIL) with a replay
    client would charge the proxy for the client's work. Yields (engine, proxy) URLs."""
    from proxy.background import free_port, spawn

    with contextlib.ExitStack() as stack:
        if engine is None:
            port = free_port()
            engine = f"http://127.0.0.1:{port}"
            sim = ["proxy", "sim", "--port", str(port), "--speed", str(speed)]
            stack.enter_context(spawn([*sim, "--log-level", "warning"], engine + "/health"))
        port = free_port()
        proxy = f"http://127.0.0.1:{port}"
        serve = ["proxy", "serve", "--upstream", engine, "--port", str(port)]
        stack.enter_context(spawn([*serve, "--log-level", "warning"], proxy + "/ready"))
        yield engine, proxy


def _can_plot() -> bool:
    from proxy.replay import plot

    try:
        plot.require()
    except plot.PlotUnavailable as exc:
        sys.stderr.write(f"no plot: {exc}\n")
        return False
    return True
