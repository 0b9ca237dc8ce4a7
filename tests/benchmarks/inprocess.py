"""CPU a request of the proxy's app in process, one request at a time.

The app is driven by a bare ASGI caller in one process (no server, no client, no socket on
the measured thread), the fast upstream runs in another, and the figure is the measured
thread's CPU time over the measured requests. The bodies are overhead.py's agent sessions,
64 of them in rotation as in its c=64 cells. Much less noisy than those cells, so it can
show a change of a few percent; it does not show what concurrency adds (queueing, other
requests' work between a request's steps, cache misses among sessions in flight).

    python -m tests.benchmarks.inprocess --size 64k --requests 3200 --repeats 4 \\
        [--baseline DIR [--paired]] [--steps-per-session 16] [--step-bytes N] \\
        [--layout sdk] [--set sessions=false ...] [--versus sessions=false ...]

The cyclic collector's CPU is counted apart from the apps' (its own line): a collection
runs for whichever request allocates past its threshold, so the two figures of one
process would otherwise differ by where the rare full collections fall.

With ``--baseline`` (another checkout, e.g. a git worktree of the commit before a change),
each repeat measures the baseline's proxy and this checkout's, one after the other, each
in a fresh process that builds the same bodies (this checkout's overhead.AgentSessions),
and the medians are compared. ``--paired`` measures both in one process instead, each
request sent to both, one right after the other: both over the same stretch of the
machine's time, so their ratio holds to a few tenths of a percent (the same code against
itself: 0.996-1.004) where separate processes drift by 10%. It cannot see a change to
what the process shares (the collector's settings, proxy.heap). ``--set SETTING=VALUE``
(repeatable, written as on the proxy's command line) measures with a setting changed;
``--versus SETTING=VALUE`` (repeatable) pairs, in each process, a second app with that
setting too: what a feature costs. Two apps in one process share its caches, so each
figure is higher than measured alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib.util
import os
import random
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


class _Collector:
    """CPU seconds the cyclic collector spent (a gc.callbacks entry). A collection runs for
    whichever request allocates past its threshold: with two apps in one process, a rare
    full one (tens of ms) lands on one app or the other as the order of the requests falls,
    a bias of 1.5% either way, so it is counted apart from both."""

    def __init__(self) -> None:
        self.spent = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            self.spent += time.thread_time() - self._started


def _app(args: argparse.Namespace, overrides: list[str], directory: Path | None = None) -> Any:
    """The proxy's app with ``overrides``; ``directory``: of the ``proxy`` package in that
    checkout, imported apart from any imported before (their modules stay with the apps
    made of them)."""
    if directory is not None:
        for name in [name for name in sys.modules if name.partition(".")[0] == "proxy"]:
            del sys.modules[name]
        sys.path.insert(0, str(directory))
    try:
        from prometheus_client import CollectorRegistry

        from proxy import config
        from proxy.app import create_app

        values = dict(item.split("=", 1) for item in overrides)
        settings = config.load({**values, "upstream": args.upstream_url}, environ={})
        return create_app(settings, registry=CollectorRegistry())
    finally:
        if directory is not None:
            sys.path.remove(str(directory))


async def measure(args: argparse.Namespace) -> list[float]:
    """CPU us a request of the app of the ``proxy`` package this process imports, and last
    the cyclic collector's (of all apps: see _Collector). With ``args.versus``, also of a
    second app with those settings too; ``args.paired``, of the baseline's app first, then
    this checkout's. The two get every request one right after the other, which goes first
    drawn for each, so both are measured over the same stretch of the machine's time."""
    if args.paired:
        apps = [_app(args, args.set, args.baseline.resolve()), _app(args, args.set, ROOT)]
    else:
        apps = [_app(args, args.set)]
    if args.versus:
        apps.append(_app(args, [*args.set, *args.versus]))
    from proxy import heap

    heap.reuse_freed_pages()  # as `prefill-proxy serve` sets the process up
    heap.settle()
    bodies = _agent_sessions(args)
    sent = [0] * WORKERS
    spent = [0.0] * len(apps)
    order = random.Random(0)
    collector = _Collector()
    gc.callbacks.append(collector)

    async def run(count: int) -> None:
        for number in range(count):
            worker = number % WORKERS
            body = bodies.body(worker, sent[worker])
            sent[worker] += 1
            first = order.randrange(2)  # which app goes first (its work may end in the next)
            for which in (first, 1 - first) if len(apps) == 2 else (0,):
                collected = collector.spent
                started = time.thread_time()
                await _post(apps[which], body)
                spent[which] += time.thread_time() - started - (collector.spent - collected)

    async with contextlib.AsyncExitStack() as stack:
        for app in apps:
            await stack.enter_async_context(app.router.lifespan_context(app))
        await run(args.warm)
        spent[:], collector.spent = [0.0] * len(apps), 0.0
        await run(args.requests)
    return [each / args.requests * 1e6 for each in (*spent, collector.spent)]


def _child(directory: Path, args: argparse.Namespace, upstream_url: str) -> list[float]:
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
    return [float(figure) for figure in done.stdout.splitlines()[-1].split()]


def _passed(args: argparse.Namespace) -> list[str]:
    passed = ["--size", args.size, "--requests", str(args.requests), "--warm", str(args.warm)]
    passed += ["--steps-per-session", str(args.steps_per_session), "--layout", args.layout]
    passed += [part for item in args.set for part in ("--set", item)]
    passed += [part for item in args.versus for part in ("--versus", item)]
    if args.paired:
        passed += ["--paired", "--baseline", str(args.baseline.resolve())]
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
        "--paired",
        action="store_true",
        help="measure the baseline's app and this checkout's in the same processes",
    )
    add(
        "--set",
        action="append",
        default=[],
        metavar="SETTING=VALUE",
        help="a proxy setting for every measurement, as on its command line (repeatable)",
    )
    add(
        "--versus",
        action="append",
        default=[],
        metavar="SETTING=VALUE",
        help="also measure, in the same processes, an app with this setting too (repeatable)",
    )
    add("--upstream-url", help=argparse.SUPPRESS)
    add("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.paired and (not args.baseline or args.versus):
        parser.error("--paired takes --baseline, and not --versus")
    for item in [*args.set, *args.versus]:
        if "=" not in item or not item.split("=", 1)[0]:
            parser.error(f"--set and --versus take SETTING=VALUE, got {item!r}")
    return args


def _print_ratios(label: str, first: list[float], second: list[float]) -> None:
    """Each repeat's ratio of ``second`` to ``first``, two figures of one process over the
    same requests, and their median."""
    ratios = [b / a for a, b in zip(first, second, strict=True)]
    listed = ", ".join(f"{ratio:.3f}" for ratio in ratios)
    print(f"{label}: median {statistics.median(ratios):.3f}x ({listed})")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        import uvloop  # the loop `prefill-proxy serve` runs on

        print(" ".join(f"{figure:.1f}" for figure in uvloop.run(measure(args))))
        return 0
    from tests.benchmarks.overhead import fast_upstream

    targets = [("proxy", ROOT)]
    if args.baseline:
        targets.insert(0, ("baseline", args.baseline.resolve()))
    versus = "versus " + ", ".join(args.versus)
    figures: dict[str, list[float]] = {}
    with fast_upstream() as upstream:
        for _ in range(args.repeats):
            if args.paired:  # one process, both apps
                baseline, proxy, collector = _child(ROOT, args, upstream.url)
                figures.setdefault("baseline", []).append(baseline)
                figures.setdefault("proxy", []).append(proxy)
                figures.setdefault("collector, both", []).append(collector)
                continue
            for name, directory in targets:
                *measured, collector = _child(directory, args, upstream.url)
                figures.setdefault(name, []).append(measured[0])
                if args.versus:
                    figures.setdefault(f"{name} {versus}", []).append(measured[1])
                both = ", both" if args.versus else ""
                figures.setdefault(f"{name} collector{both}", []).append(collector)
    heading = f"CPU us a request, {args.size}, {args.requests} requests a repeat, one at a time"
    print(heading + (f", with {', '.join(args.set)}" if args.set else ""))
    for name, values in figures.items():
        listed = ", ".join(f"{value:.0f}" for value in values)
        print(f"{name}: median {statistics.median(values):.0f} ({listed})")
    for name, _ in targets if args.versus else ():
        _print_ratios(f"{name} {versus} / {name}", figures[name], figures[f"{name} {versus}"])
    if args.paired:
        _print_ratios("proxy / baseline, paired", figures["baseline"], figures["proxy"])
    elif args.baseline:
        ratio = statistics.median(figures["proxy"]) / statistics.median(figures["baseline"])
        print(f"proxy / baseline: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
