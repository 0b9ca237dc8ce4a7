"""CPU a request of the proxy's app in process, one request at a time.

The app is driven by a bare ASGI caller in one process (no server, no client, no socket on
the measured thread), the fast upstream runs in another, and the figure is the measured
thread's CPU time over the measured requests. The bodies are overhead.py's agent sessions,
64 of them in rotation as in its c=64 cells. Much less noisy than those cells, so it can
show a change of a few percent; it does not show what concurrency adds (queueing, other
requests' work between a request's steps, cache misses among sessions in flight).

    python -m tests.benchmarks.inprocess --size 64k --requests 3200 --repeats 4 \\
        [--baseline DIR] [--steps-per-session 16] [--step-bytes N] [--layout sdk] \\
        [--set sessions=false ...]

With ``--baseline`` (another checkout, e.g. a git worktree of the commit before a change),
each repeat measures the baseline's proxy and this checkout's, one after the other, each
in a fresh process that builds the same bodies (this checkout's overhead.AgentSessions),
and the medians are compared. Joining each body from its steps is measured with it (a few
us at 64 KB), the same for both. ``--set SETTING=VALUE`` (repeatable, written as on the
proxy's command line) measures both with a setting changed: what a feature costs.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SIZES = {"64k": 64_000, "256k": 256_000, "1m": 1_000_000}
WORKERS = 64  # sessions in rotation, as in overhead.py's c=64 cells
CHAT = b"/v1/chat/completions"


def _agent_sessions(args: argparse.Namespace) -> Any:
    """overhead.AgentSessions of this file's checkout, whichever proxy is imported."""
    spec = importlib.util.spec_from_file_location(
        "_overhead", Path(__file__).with_name("overhead.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.AgentSessions(
        SIZES[args.size], False, args.step_bytes, args.steps_per_session, "", args.layout
    )


async def _post(app: Any, body: bytes) -> None:
    """One chat request through ``app``; raises unless it answers 200."""
    done = asyncio.Event()
    parts = [{"type": "http.request", "body": body, "more_body": False}]
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        if parts:
            return parts.pop()
        await done.wait()  # the client stays until the answer is complete
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])
        elif not message.get("more_body"):
            done.set()

    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": CHAT.decode(),
        "raw_path": CHAT,
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
        "state": {},
    }
    await app(scope, receive, send)
    if status != [200]:
        raise RuntimeError(f"the proxy answered {status}")


async def measure(args: argparse.Namespace) -> float:
    """CPU us a request of the app of the ``proxy`` package this process imports."""
    from prometheus_client import CollectorRegistry

    from proxy import config, heap
    from proxy.app import create_app

    overrides = dict(item.split("=", 1) for item in args.set)
    settings = config.load({**overrides, "upstream": args.upstream_url}, environ={})
    app = create_app(settings, registry=CollectorRegistry())
    heap.reuse_freed_pages()  # as `prefill-proxy serve` sets the process up
    heap.settle()
    bodies = _agent_sessions(args)
    sent = [0] * WORKERS

    async def run(count: int) -> None:
        for number in range(count):
            worker = number % WORKERS
            await _post(app, bodies.body(worker, sent[worker]))
            sent[worker] += 1

    async with app.router.lifespan_context(app):
        await run(args.warm)
        started = time.thread_time()
        await run(args.requests)
        return (time.thread_time() - started) / args.requests * 1e6


def _child(directory: Path, args: argparse.Namespace, upstream_url: str) -> float:
    """``measure`` in a fresh process that imports ``proxy`` from ``directory``."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "--upstream-url",
        upstream_url,
        *_passed(args),
    ]
    environment = {**os.environ, "PYTHONPATH": str(directory)}
    done = subprocess.run(
        command, cwd=directory, env=environment, capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise RuntimeError(f"measuring {directory} failed:\n{done.stderr[-4000:]}")
    return float(done.stdout.split()[-1])


def _passed(args: argparse.Namespace) -> list[str]:
    passed = ["--size", args.size, "--requests", str(args.requests), "--warm", str(args.warm)]
    passed += ["--steps-per-session", str(args.steps_per_session), "--layout", args.layout]
    passed += [part for item in args.set for part in ("--set", item)]
    return passed + (["--step-bytes", str(args.step_bytes)] if args.step_bytes else [])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--size", default="64k", choices=sorted(SIZES), help="session size (default 64k)")
    add("--requests", type=int, default=3200, help="measured requests a repeat")
    add("--warm", type=int, default=1600, help="requests before measuring (sessions built)")
    add("--repeats", type=int, default=4, help="measurements of each checkout, alternating")
    add("--steps-per-session", type=int, default=16, help="as overhead.py's (default 16)")
    add("--step-bytes", type=int, help="as overhead.py's (default size/64)")
    add("--layout", default="tools-first", choices=["tools-first", "sdk"])
    add("--baseline", type=Path, metavar="DIR", help="also measure the proxy of this checkout")
    add(
        "--set",
        action="append",
        default=[],
        metavar="SETTING=VALUE",
        help="a proxy setting for every measurement, as on its command line (repeatable)",
    )
    add("--upstream-url", help=argparse.SUPPRESS)
    add("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for item in args.set:
        if "=" not in item or not item.split("=", 1)[0]:
            parser.error(f"--set takes SETTING=VALUE, got {item!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        import uvloop  # the loop `prefill-proxy serve` runs on

        print(f"{uvloop.run(measure(args)):.1f}")
        return 0
    from tests.benchmarks.overhead import fast_upstream

    targets = [("proxy", ROOT)]
    if args.baseline:
        targets.insert(0, ("baseline", args.baseline.resolve()))
    figures: dict[str, list[float]] = {name: [] for name, _ in targets}
    with fast_upstream() as upstream:
        for _ in range(args.repeats):
            for name, directory in targets:
                figures[name].append(_child(directory, args, upstream.url))
    heading = f"CPU us a request, {args.size}, {args.requests} requests a repeat, one at a time"
    print(heading + (f", with {', '.join(args.set)}" if args.set else ""))
    for name, values in figures.items():
        listed = ", ".join(f"{value:.0f}" for value in values)
        print(f"{name}: median {statistics.median(values):.0f} ({listed})")
    if args.baseline:
        ratio = statistics.median(figures["proxy"]) / statistics.median(figures["baseline"])
        print(f"proxy / baseline: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
