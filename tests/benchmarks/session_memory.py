"""Memory the in-memory session store holds per session, measured on the real traces.

Replays every step of the bundled dev traces (``proxy/replay/bundled/dev.jsonl``) through
the proxy's session logic in process (lookup, rewrite pipeline, continuity, recording
the reply, with the recorded answer as the reply) and measures the store with
tracemalloc; then the size of a session's record as a shared store keeps it
(proxy.session_codec bytes) against its step number, and what bounds it. Prints tables.
``--synthetic N --steps S`` replays generated conversations instead (long sessions).

    .venv/bin/python -m tests.benchmarks.session_memory
"""

from __future__ import annotations

import argparse
import asyncio
import tracemalloc
from pathlib import Path

from prometheus_client import CollectorRegistry

from proxy import config, session_codec
from proxy.app import default_transforms
from proxy.exchange import Exchange
from proxy.metrics import Metrics
from proxy.replay import profiles, request, synthetic, traces
from proxy.rewrite import Pipeline, RewriteContext
from proxy.rewrite.canonical_tools import _canonical_tools
from proxy.rewrite.detector import VolatileDetector
from proxy.sessions import MemoryStore
from proxy.tracker import SessionTracker

TRACES = traces.bundled("dev")


def replay(
    steps: list[traces.Step], profile: profiles.Profile, sizes: dict[int, list[int]] | None
) -> MemoryStore:
    """Every step through the session logic; the store. ``sizes``: filled with each
    record's codec bytes by step number (0-based) after that step."""
    settings = config.Settings()
    detector = VolatileDetector()
    pipeline = Pipeline(default_transforms(settings))
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
        if sizes is not None:
            record = asyncio.run(store.get(turn.session.key))
            assert record is not None
            sizes.setdefault(step.index, []).append(len(session_codec.encode(record)))
    # What stays is the store's: the rewrites' caches are per process, not per session.
    _canonical_tools.cache_clear()
    detector._line_spans.cache_clear()  # type: ignore[attr-defined]
    return store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", type=Path, default=TRACES)
    parser.add_argument("--profile", default="mixed", choices=sorted(profiles.PROFILES))
    parser.add_argument("--synthetic", type=int, help="generated conversations instead")
    parser.add_argument("--steps", type=int, help="with --synthetic: model calls each")
    args = parser.parse_args()
    if args.synthetic:
        conversations = synthetic.conversations(args.synthetic, 0, steps=args.steps)
        source = f"synthetic x{args.synthetic}"
    else:
        conversations = traces.load(args.traces)
        source = args.traces.name
    steps = [step for conversation in conversations for step in traces.steps(conversation)]
    profile = profiles.PROFILES[args.profile]

    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    store = replay(steps, profile, None)
    after = tracemalloc.take_snapshot()
    held = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    tracemalloc.stop()
    sessions = len(store)
    print(
        f"| traces | profile | conversations | steps | sessions | store bytes | per session "
        f"| per step |\n|---|---|---:|---:|---:|---:|---:|---:|\n"
        f"| {source} | {args.profile} | {len(conversations)} | {len(steps)} | "
        f"{sessions} | {held:,} | {held // max(sessions, 1):,} | {held // len(steps):,} |"
    )
    sizes: dict[int, list[int]] = {}
    replay(steps, profile, sizes)
    print("\n| after step | records | record bytes p50 | max |\n|---:|---:|---:|---:|")
    for index in sorted(sizes):
        if index in (0, 1, 3) or (index + 1) % 8 == 0 or index == max(sizes):
            values = sorted(sizes[index])
            print(
                f"| {index + 1} | {len(values)} | {values[len(values) // 2]:,} | {values[-1]:,} |"
            )


if __name__ == "__main__":
    main()
