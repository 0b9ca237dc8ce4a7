"""Memory the in-memory session store holds per session, measured on the real traces.

Replays every step of the bundled dev traces (``proxy/replay/bundled/dev.jsonl``) through
the proxy's session logic in process (lookup, rewrite pipeline, continuity, recording
the reply, with the recorded answer as the reply) and measures the store with
tracemalloc. Prints one table.

    .venv/bin/python -m tests.benchmarks.session_memory
"""

from __future__ import annotations

import argparse
import asyncio
import tracemalloc
from pathlib import Path

from prometheus_client import CollectorRegistry

from proxy import config
from proxy.app import default_transforms
from proxy.exchange import Exchange
from proxy.metrics import Metrics
from proxy.replay import profiles, request, traces
from proxy.rewrite import Pipeline, RewriteContext
from proxy.rewrite.canonical_tools import _canonical_tools
from proxy.rewrite.volatile import VolatileDetector
from proxy.sessions import MemoryStore
from proxy.tracker import SessionTracker

TRACES = traces.bundled("dev")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=Path, default=TRACES)
    parser.add_argument("--profile", default="mixed", choices=sorted(profiles.PROFILES))
    args = parser.parse_args()
    conversations = traces.load(args.traces)
    steps = [step for conversation in conversations for step in traces.steps(conversation)]
    settings = config.Settings()
    detector = VolatileDetector()
    pipeline = Pipeline(default_transforms(settings))
    profile = profiles.PROFILES[args.profile]

    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    store = MemoryStore(settings.session_max, settings.session_ttl)
    tracker = SessionTracker(store, detector, Metrics(CollectorRegistry()))
    for step in steps:
        body = request.build(step, profile, "m")
        turn = asyncio.run(tracker.open({}, body))
        assert turn is not None
        context = RewriteContext(session=turn.session, volatile=detector)
        forwarded = pipeline.apply(body, context).request
        exchange = Exchange("/v1/chat/completions", "POST", status=200)
        tracker.forward(turn, forwarded, exchange)
        exchange.usage = {"prompt_tokens": 1000, "completion_tokens": 50}
        exchange.reply = step.reply
        asyncio.run(tracker.close(turn, exchange))
    # What stays is the store's: the rewrites' caches are per process, not per session.
    _canonical_tools.cache_clear()
    detector._line_spans.cache_clear()  # type: ignore[attr-defined]
    after = tracemalloc.take_snapshot()
    held = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    tracemalloc.stop()
    sessions = len(store)
    print(
        f"| traces | profile | conversations | steps | sessions | store bytes | per session "
        f"| per step |\n|---|---|---:|---:|---:|---:|---:|---:|\n"
        f"| {args.traces.name} | {args.profile} | {len(conversations)} | {len(steps)} | "
        f"{sessions} | {held:,} | {held // max(sessions, 1):,} | {held // len(steps):,} |"
    )


if __name__ == "__main__":
    main()
