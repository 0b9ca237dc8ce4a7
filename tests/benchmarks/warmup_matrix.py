"""Warm-up over a matrix of traffic shapes: does it pay where it was not tuned?

Each cell runs tests/benchmarks/warmup.py's two modes (warm-up off, then on; a fresh
simulator and proxy each, at speed 1 so that tool rounds and engine time are real) on
the dev traces or on synthetic sessions (tests/benchmarks/shapes.py), varying KV capacity
(roomy to heavily oversubscribed), sessions at once, tool time (fixed or drawn per call),
how much of the prompt sessions share, and parallel tool calls per step. Prints one
markdown table, writes every cell's figures as JSON and, with matplotlib, a plot of the
gain over the matrix.

    .venv/bin/python -m tests.benchmarks.warmup_matrix                  # ~25 minutes
    .venv/bin/python -m tests.benchmarks.warmup_matrix --cells dev-40k-24-5s,shared-none
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from proxy.replay import traces
from proxy.replay.report import percentile
from tests.benchmarks import warmup
from tests.benchmarks.shapes import Shape, sessions


@dataclasses.dataclass(frozen=True)
class Cell:
    name: str
    capacity: int  # the simulator's KV cache, tokens
    sessions: int  # conversations at once (each cell runs one wave of them)
    tool_s: float  # seconds per tool round, or the low end of a range
    tool_max_s: float | None = None  # drawn per call from tool_s..tool_max_s
    shape: Shape | None = None  # None: the dev traces


DEV = None
WIDE = Shape(sessions=24, system_chars=20_000, shared=1.0, tools=13)
CELLS = (
    # The dev traces (three system prompts + tools of ~4.3k tokens, ~2k of their own).
    Cell("dev-roomy-24-5s", 400_000, 24, 5.0),
    Cell("dev-60k-12-3s", 60_000, 12, 3.0),
    Cell("dev-40k-24-5s", 40_000, 24, 5.0),
    Cell("dev-30k-16-5s", 30_000, 16, 5.0),
    Cell("dev-40k-24-0.5s", 40_000, 24, 0.5),
    Cell("dev-40k-24-varied", 40_000, 24, 0.5, 10.0),
    Cell("dev-25k-24-10s", 25_000, 24, 10.0),
    # Synthetic: a 20k-character system prompt (~3k tokens) and 13 tools (~1.9k), shared
    # by every session or by none; ~6.3k tokens a session at 8 steps.
    Cell("shared-most-25k", 25_000, 24, 5.0, shape=WIDE),
    Cell("shared-half-50k", 50_000, 24, 5.0, shape=dataclasses.replace(WIDE, shared=0.5)),
    Cell("shared-none-100k", 100_000, 24, 5.0, shape=dataclasses.replace(WIDE, shared=0.0)),
    Cell("shared-none-roomy", 400_000, 24, 5.0, shape=dataclasses.replace(WIDE, shared=0.0)),
    # 44 tools (~6.5k tokens), 4 parallel calls a step, tool time 3-9 s; ~12.6k a session.
    Cell(
        "parallel-4-44tools",
        60_000,
        16,
        3.0,
        3.0 * 3,
        shape=Shape(sessions=16, system_chars=8_000, shared=0.5, tools=44, parallel=4),
    ),
)
STEPS = 8  # model calls per conversation


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--cells", default=",".join(c.name for c in CELLS), help="comma-separated names")
    add("--steps", type=int, default=STEPS, help=f"model calls per conversation ({STEPS})")
    add("--proxy-setting", action="append", default=[], metavar="NAME=VALUE")
    add("--json", type=Path, default=Path(".artifacts/warmup-matrix.json"))
    add("--plot", type=Path, help="a PNG of the gain per cell (needs matplotlib)")
    add(
        "--report",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="only print the table of earlier runs' --json files; a cell in several files "
        "is pooled over all their runs",
    )
    add(
        "--repeat",
        type=int,
        default=1,
        help="runs of each mode per cell, interleaved (off, on, off, on, ...); figures pooled "
        "over the runs, with the ratio of each run and off against off (noise) beside them",
    )
    return parser.parse_args(argv)


def conversations(cell: Cell, steps: int) -> list[traces.Conversation]:
    if cell.shape is None:
        loaded = traces.load(warmup.TRACES, cell.sessions)
    else:
        loaded = sessions(dataclasses.replace(cell.shape, sessions=cell.sessions))
    return [warmup.truncate(c, steps) for c in loaded]


def run_cell(cell: Cell, args: argparse.Namespace) -> dict[str, Any]:
    options = argparse.Namespace(
        speed=1.0,
        capacity_tokens=cell.capacity,
        concurrency=cell.sessions,
        tool_latency=cell.tool_s,
        tool_latency_max=cell.tool_max_s,
        # Sessions start spread over one tool round, as a service in steady state sees
        # them: started together, identical sessions would stay in lockstep.
        start_spread=cell.tool_s
        if cell.tool_max_s is None
        else (cell.tool_s + cell.tool_max_s) / 2,
        proxy_setting=args.proxy_setting,
    )
    chosen = conversations(cell, args.steps)
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    for run in range(args.repeat):
        for mode in ("off", "on"):
            result = warmup.run_mode(options, mode == "on", chosen)
            for record in result["records"]:
                record["run"] = run  # steps are paired within a run (lost_steps)
            runs[mode].append(result)
    pairs = zip(runs["off"], runs["on"], strict=True)
    noise = [(off["p50"], on["p50"], off["p95"], on["p95"]) for off, on in pairs]
    return summary(dataclasses.asdict(cell), runs["off"], runs["on"], noise)


def summary(
    cell: dict[str, Any],
    offs: list[dict[str, Any]],
    ons: list[dict[str, Any]],
    runs: list[Any],
) -> dict[str, Any]:
    """A cell's figures: each mode pooled over its runs, with the steps compared across
    modes; ``runs``: each run's (off p50, on p50, off p95, on p95)."""
    off, on = pooled(offs), pooled(ons)
    return {
        "cell": cell,
        "off": off,
        "on": on,
        **lost_steps(off, on),
        "paired": paired(off, on),
        "runs": runs,
    }


SUMMED = (
    "steps",
    "errors",
    "after_tool",
    "cold",
    "engine_computed",
    "warmups",
    "warmup_errors",
    "timed",
    "warmup_tokens",
    "warmed_cached",
    "warmed_missed",
    "wall",
)


def pooled(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One mode's runs as one: percentiles over every run's steps, counts summed, shares
    of the pooled steps, the engine's idle and compute shares averaged."""
    if len(results) == 1:
        return results[0]
    records = [record for result in results for record in result["records"]]
    ttfts = [r["ttft_s"] for r in records if r["ttft_s"] is not None]
    prompt = sum(r["prompt_tokens"] or 0 for r in records)
    cached = sum(r["cached_tokens"] or 0 for r in records)
    merged: dict[str, Any] = {**results[0], "records": records}
    merged.update({key: sum(result[key] for result in results) for key in SUMMED})
    merged.update(
        p50=percentile(ttfts, 0.5),
        p90=percentile(ttfts, 0.9),
        p95=percentile(ttfts, 0.95),
        cached_share=cached / prompt if prompt else 0.0,
        queued_share=[q for result in results for q in result.get("queued_share") or []],
    )
    skips: dict[str, float] = {}
    for result in results:
        for reason, count in result["skips"].items():
            skips[reason] = skips.get(reason, 0.0) + count
    merged["skips"] = skips
    for key in ("engine_idle", "engine_compute"):
        known = [result[key] for result in results if result[key] is not None]
        merged[key] = sum(known) / len(known) if known else None
    return merged


def _step_key(record: dict[str, Any]) -> tuple[int, str, int]:
    """A step after tool calls, the same in both modes of a run."""
    return record.get("run", 0), record["conversation"], record["step"]


def _computed(record: dict[str, Any]) -> int:
    return (record["prompt_tokens"] or 0) - (record["cached_tokens"] or 0)


def merged(files: Sequence[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Cells of several runs' --json files, each cell pooled over every run of it (runs
    numbered apart per file, so steps pair within their own run)."""
    cells: dict[str, list[dict[str, Any]]] = {}
    for number, results in enumerate(files):
        for result in results:
            modes = {
                mode: {
                    **result[mode],
                    "records": [
                        {**r, "run": 1000 * number + r.get("run", 0)}
                        for r in result[mode]["records"]
                    ],
                }
                for mode in ("off", "on")
            }
            cells.setdefault(result["cell"]["name"], []).append({**result, **modes})
    return [
        runs[0]
        if len(runs) == 1
        else summary(
            runs[0]["cell"],
            [run["off"] for run in runs],
            [run["on"] for run in runs],
            [r for run in runs for r in run.get("runs") or []],
        )
        for runs in cells.values()
    ]


def lost_steps(off: dict[str, Any], on: dict[str, Any]) -> dict[str, Any]:
    """The steps after tool calls that lost their prefix without warm-up, and their TTFT
    p50 off and on: what warm-up can win where blocks are lost (the p50 of all steps moves
    only where most of them lose theirs)."""
    key, computed = _step_key, _computed
    lost = {key(r): r for r in off["records"] if computed(r) > warmup.COLD_TOKENS}
    paired = [(lost[key(r)], r) for r in on["records"] if key(r) in lost]
    off_ttft = [a["ttft_s"] for a, _ in paired if a["ttft_s"] is not None]
    on_ttft = [b["ttft_s"] for _, b in paired if b["ttft_s"] is not None]
    return {
        "lost_share": len(lost) / max(off["after_tool"], 1),
        "lost_p50_off": percentile(off_ttft, 0.5),
        "lost_p50_on": percentile(on_ttft, 0.5),
    }


CHANGED_TOKENS = 64  # a step cached this many tokens more (or fewer) with warm-up: it changed
RESAMPLES = 2000


def paired(off: dict[str, Any], on: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """The same steps with and without warm-up (by run, conversation and step): how many
    cached more or less with it, and 95% intervals of the p50 and p95 gain (off / on) from
    a bootstrap over the pairs. The pooled ratios alone cannot say whether a few percent
    is the warm-up or the steps that happened to be drawn; the interval says how far the
    steps alone move them (a run's timing moves them further: see the per-run column)."""
    key, computed = _step_key, _computed
    offs = {key(r): r for r in off["records"] if r["ttft_s"] is not None}
    pairs = [(offs[key(r)], r) for r in on["records"] if r["ttft_s"] is not None and key(r) in offs]
    more = sum(computed(a) - computed(b) >= CHANGED_TOKENS for a, b in pairs)
    less = sum(computed(b) - computed(a) >= CHANGED_TOKENS for a, b in pairs)
    result: dict[str, Any] = {"pairs": len(pairs), "cached_more": more, "cached_less": less}
    if len(pairs) < 2:
        return result
    draw = random.Random(seed)
    gains: dict[float, list[float]] = {0.5: [], 0.95: []}
    for _ in range(RESAMPLES):
        sample = draw.choices(pairs, k=len(pairs))
        a = [x["ttft_s"] for x, _ in sample]
        b = [y["ttft_s"] for _, y in sample]
        for q, kept in gains.items():
            kept.append(percentile(a, q) / max(percentile(b, q), 1e-9))
    for q, kept in gains.items():
        kept.sort()
        name = "p50" if q == 0.5 else "p95"
        result[f"{name}_ci"] = (kept[int(0.025 * RESAMPLES)], kept[int(0.975 * RESAMPLES) - 1])
    return result


def _ratio(off: float | None, on: float | None) -> str:
    return f"{off / on:.2f}x" if off and on else "n/a"


def _ms(value: float | None) -> str:
    return f"{1000 * (value or 0):,.0f}"


def row(result: dict[str, Any]) -> str:
    cell, off, on = result["cell"], result["off"], result["on"]
    shape = cell["shape"]
    what = (
        "dev traces"
        if shape is None
        else (
            f"{shape['system_chars'] // 1000}k chars, shared {shape['shared']:.0%}, "
            f"{shape['tools']} tools, {shape['parallel']} calls"
        )
    )
    tool = f"{cell['tool_s']:g}" + (f"-{cell['tool_max_s']:g}" if cell["tool_max_s"] else "")
    extra = on["engine_computed"] - off["engine_computed"]
    skips = ", ".join(f"{k} {v:.0f}" for k, v in sorted(on["skips"].items())) or "0"

    def share(mode: dict[str, Any], key: str) -> str:
        return "n/a" if mode.get(key) is None else f"{100 * mode[key]:.0f}%"

    idle = f"{share(off, 'engine_idle')} / {share(on, 'engine_idle')}"
    queue = on.get("queued_share") or []
    queued = (
        f"{sum(queue) / len(queue):.2f} ({sum(q >= 0.5 for q in queue) / len(queue):.0%} / "
        f"{sum(q >= 0.3 for q in queue) / len(queue):.0%})"
        if queue
        else "n/a"
    )
    compute = f"{share(off, 'engine_compute')} / {share(on, 'engine_compute')}"
    cells = (
        cell["name"],
        what,
        f"{cell['capacity'] // 1000}k",
        str(cell["sessions"]),
        tool,
        f"{_ms(off['p50'])} -> {_ms(on['p50'])} ({_ratio(off['p50'], on['p50'])})",
        f"{_ms(off['p95'])} -> {_ms(on['p95'])} ({_ratio(off['p95'], on['p95'])})",
        f"{100 * off['cached_share']:.1f} / {100 * on['cached_share']:.1f}%",
        f"{off['cold']} / {on['cold']} of {off['after_tool']}",
        f"{_ms(result['lost_p50_off'])} -> {_ms(result['lost_p50_on'])} "
        f"({_ratio(result['lost_p50_off'], result['lost_p50_on'])})",
        f"{off['engine_computed']:,.0f} -> {on['engine_computed']:,.0f} "
        f"({100 * extra / max(off['engine_computed'], 1):+.1f}%)",
        f"{on['warmups']:.0f} ({on['timed']:.0f} timed); skipped: {skips}",
        f"{on['warmed_cached']:.0f} / {on['warmed_missed']:.0f}",
        idle,
        compute,
        queued,
        per_run(result.get("runs") or []),
        _paired(result.get("paired") or paired(off, on)),
    )
    return "| " + " | ".join(cells) + " |"


def _paired(figures: dict[str, Any]) -> str:
    if "p50_ci" not in figures:
        return "-"
    (a, b), (c, d) = figures["p50_ci"], figures["p95_ci"]
    return (
        f"p50 {a:.2f}-{b:.2f}x, p95 {c:.2f}-{d:.2f}x; "
        f"{figures['cached_more']} / {figures['cached_less']} of {figures['pairs']}"
    )


def per_run(runs: Sequence[Sequence[float | None]]) -> str:
    """Each run's p50 and p95 ratio off/on, and the spread of off against off (the first
    run's off against each later one's): the noise the pooled ratios sit in."""
    if len(runs) < 2:
        return "-"

    def span(ratios: list[float]) -> str:
        return f"{min(ratios):.2f}-{max(ratios):.2f}x"

    def ratios(a: int, b: int, pairs: Sequence[tuple[Any, Any]]) -> list[float]:
        return [x[a] / y[b] for x, y in pairs if x[a] and y[b]]

    same = [(run, run) for run in runs]
    offs = [(runs[0], run) for run in runs[1:]]
    return (
        f"p50 {span(ratios(0, 1, same))}, p95 {span(ratios(2, 3, same))}; "
        f"off/off p50 {span(ratios(0, 0, offs))}, p95 {span(ratios(2, 2, offs))}"
    )


HEADER = (
    "cell",
    "sessions' shape",
    "KV",
    "at once",
    "tool s",
    "TTFT p50 ms after tools, off -> on",
    "p95",
    "cached share off / on",
    "prefix lost off / on",
    "TTFT p50 of the steps lost off, off -> on",
    "engine prefill, tokens off -> on",
    "warm-ups sent",
    "warmed steps cached / missed",
    "engine idle off / on",
    "engine compute busy off / on",
    "queued share on: mean (time at >= 0.5 / >= 0.3)",
    "per run: off/on ratios; off/off (noise)",
    "paired steps: 95% interval of the gain off/on; cached more / less with warm-up",
)


def table(results: Sequence[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|---" + "|---:" * (len(HEADER) - 1) + "|"]
    return "\n".join([*lines, *(row(r) for r in results)])


def plot(results: Sequence[dict[str, Any]], path: Path) -> None:
    from proxy.replay.plot import _pyplot

    plt = _pyplot()
    names = [r["cell"]["name"] for r in results]
    gains = [(r["off"]["p50"] or 0) / (r["on"]["p50"] or 1) for r in results]
    tails = [(r["off"]["p95"] or 0) / (r["on"]["p95"] or 1) for r in results]
    figure, axes = plt.subplots(figsize=(10, 4.5))
    xs = range(len(names))
    axes.bar([x - 0.2 for x in xs], gains, 0.4, label="TTFT p50 off / on")
    axes.bar([x + 0.2 for x in xs], tails, 0.4, label="TTFT p95 off / on")
    axes.axhline(1.0, color="grey", linewidth=0.8)
    axes.axhline(2.0, color="grey", linewidth=0.8, linestyle="--")
    axes.set_xticks(list(xs), names, rotation=35, ha="right", fontsize=8)
    axes.set_ylabel("gain after tool calls (x)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        print(table(merged([json.loads(path.read_text()) for path in args.report])))
        return 0
    by_name = {cell.name: cell for cell in CELLS}
    unknown = [name for name in args.cells.split(",") if name not in by_name]
    if unknown:
        print(f"unknown cells: {', '.join(unknown)}; known: {', '.join(by_name)}")
        return 2
    results = []
    for name in args.cells.split(","):
        results.append(run_cell(by_name[name], args))
        print(row(results[-1]), file=sys.stderr, flush=True)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1) + "\n")  # kept as it goes
    print(table(results))
    if args.plot:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
