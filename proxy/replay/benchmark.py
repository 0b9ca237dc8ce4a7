"""One replay benchmark from start to end: conversations in, one or two runs (straight at
the target, then through the proxy), tables out, JSON and plot written on request."""

from __future__ import annotations

import collections
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from proxy import __version__
from proxy.replay import plot, profiles, report, synthetic, traces
from proxy.replay.progress import Progress
from proxy.replay.records import Run
from proxy.replay.runner import (
    Options,
    Replayer,
    ReplayError,
    discover_model,
    make_client,
    reset_prefix_cache,
)


@dataclasses.dataclass(frozen=True)
class Config:
    target: str
    traces: Path | None = None
    synthetic: int | None = None  # generate this many conversations instead of --traces
    seed: int = 0
    synthetic_steps: int | None = None  # model calls per generated conversation
    limit: int | None = None
    compare: str | None = None  # the proxy's URL: run at target, then through it
    profile: str = "faithful"
    concurrency: int = 1
    tool_latency: float = 0.0
    model: str | None = None
    max_tokens: int | None = None
    trim_tokens: int | None = None  # client-trim's budget
    reset_cache: str | None = None  # POST {reset_cache}/reset_prefix_cache before each run
    json_path: Path | None = None
    plot_path: Path | None = None
    progress: bool = False
    timeout: float = 600.0
    api_key: str | None = None
    api: str = "chat"  # the wire format the client speaks: "chat" or "responses"
    echo_replies: bool = False  # send back the engine's replies, not the recorded ones


@dataclasses.dataclass(frozen=True)
class Outcome:
    label: str
    url: str
    run: Run
    summary: dict[str, Any]


def load_conversations(config: Config) -> list[traces.Conversation]:
    if config.synthetic is not None:
        count = min(config.synthetic, config.limit or config.synthetic)
        return synthetic.conversations(count, config.seed, steps=config.synthetic_steps)
    if config.traces is None:
        raise ReplayError("give --traces FILE or --synthetic N")
    try:
        return traces.load(config.traces, config.limit)
    except OSError as exc:
        raise ReplayError(f"cannot read {config.traces}: {exc.strerror or exc}") from exc
    except traces.TraceError as exc:
        raise ReplayError(str(exc)) from exc


async def execute(config: Config, out: TextIO, err: TextIO) -> int:
    """Run the benchmark; 0 when every step succeeded, 1 when some failed, 2 when it could
    not run or not write its files."""
    try:
        if config.plot_path:
            plot.require()
        conversations = load_conversations(config)
        for note in profiles.notes(config.profile, conversations):
            err.write(f"note: {note}\n")
        outcomes, model = await _replay(config, conversations, err)
    except (ReplayError, plot.PlotUnavailable) as exc:
        err.write(f"prefill-proxy replay: {exc}\n")
        return 2
    # Files first: a reader that stops reading the tables (| head) must not lose them.
    failure = None
    try:
        written = _write_outputs(config, model, len(conversations), outcomes)
    except (OSError, plot.PlotUnavailable) as exc:
        written, failure = [], exc
    total = sum(len(o.run.steps) for o in outcomes) // len(outcomes)
    out.write(
        f"## replay: {len(conversations)} conversations, {total} steps, profile "
        f"{_profile_label(config)}, model {model}, concurrency {config.concurrency}\n\n"
    )
    out.write(report.summary_table([(o.label, o.summary) for o in outcomes]) + "\n\n")
    out.write(report.step_table([(o.label, o.run.steps) for o in outcomes]) + "\n")
    if written:
        out.write("\n" + "".join(f"{line}\n" for line in written))
    _warn(outcomes, err)
    if failure is not None:
        err.write(f"prefill-proxy replay: {failure}\n")
        return 2
    return 1 if any(o.summary["errors"] for o in outcomes) else 0


async def _replay(
    config: Config, conversations: Sequence[traces.Conversation], err: TextIO
) -> tuple[list[Outcome], str]:
    if config.compare:
        targets = [("direct", config.target), ("proxy", config.compare)]
    else:
        targets = [(config.target, config.target)]
    total = traces.count_steps(conversations)
    outcomes = []
    async with make_client(config.concurrency, config.timeout, config.api_key) as client:
        model = config.model or await discover_model(client, config.target)
        options = Options(
            model=model,
            profile=config.profile,
            concurrency=config.concurrency,
            tool_latency=config.tool_latency,
            max_tokens=config.max_tokens,
            trim_tokens=config.trim_tokens,
            api=config.api,
            echo_replies=config.echo_replies,
        )
        for label, url in targets:
            if config.reset_cache:
                await reset_prefix_cache(client, config.reset_cache)
            progress = Progress(label, total, err, enabled=config.progress)
            replayer = Replayer(client, url, options, on_step=progress.record)
            run = await replayer.run(conversations)
            progress.close()
            outcomes.append(Outcome(label, url, run, report.summarize(run.steps, run.wall_s)))
    return outcomes, model


def _warn(outcomes: Sequence[Outcome], err: TextIO) -> None:
    for outcome in outcomes:
        summary = outcome.summary
        if summary["without_usage"]:
            err.write(
                f"warning: {outcome.label}: {summary['without_usage']} steps came without "
                "a usage chunk (stream_options.include_usage); their tokens count as 0\n"
            )
        if summary["without_cached_tokens"]:
            err.write(
                f"warning: {outcome.label}: {summary['without_cached_tokens']} steps had no "
                "usage.prompt_tokens_details.cached_tokens (vLLM: "
                "--enable-prompt-tokens-details); counted as 0 cached\n"
            )
        errors = collections.Counter(
            (s.status, s.error) for s in outcome.run.steps if s.error is not None
        )
        for (status, message), count in errors.most_common(5):
            err.write(f"error: {outcome.label}: {count} x status {status}: {message}\n")


def _trim_tokens(config: Config) -> int | None:
    if config.profile != "client-trim":
        return None
    return config.trim_tokens if config.trim_tokens is not None else profiles.TRIM_TOKENS


def _profile_label(config: Config) -> str:
    trim = _trim_tokens(config)
    return config.profile if trim is None else f"{config.profile} ({trim:,} tokens)"


def _config_record(config: Config, model: str, conversations: int, url: str) -> dict[str, Any]:
    return {
        "url": url,
        "target": config.target,
        "compare": config.compare,
        "model": model,
        "profile": config.profile,
        "concurrency": config.concurrency,
        "tool_latency_s": config.tool_latency,
        "max_tokens": config.max_tokens,
        "limit": config.limit,
        "traces": str(config.traces) if config.traces else None,
        "synthetic": config.synthetic,
        "seed": config.seed if config.synthetic is not None else None,
        "synthetic_steps": config.synthetic_steps,
        "trim_tokens": _trim_tokens(config),
        "conversations": conversations,
        "reset_cache": config.reset_cache,
        "echo_replies": config.echo_replies,
        "prefill_proxy_version": __version__,
    }


def _write_outputs(
    config: Config, model: str, conversations: int, outcomes: Sequence[Outcome]
) -> list[str]:
    """Write --json and --plot; say where."""
    written = []
    if config.json_path:
        documents = {
            o.label: report.document(
                o.run.steps, o.summary, _config_record(config, model, conversations, o.url)
            )
            for o in outcomes
        }
        payload = documents if config.compare else next(iter(documents.values()))
        config.json_path.parent.mkdir(parents=True, exist_ok=True)
        config.json_path.write_text(json.dumps(payload, indent=1) + "\n")
        written.append(f"json: {config.json_path}")
    if config.plot_path:
        source = f"synthetic x{conversations}" if config.synthetic else config.traces
        title = f"{source}, profile {_profile_label(config)}"
        plot.draw([(o.label, o.run.steps) for o in outcomes], config.plot_path, title)
        written.append(f"plot: {config.plot_path}")
    return written
