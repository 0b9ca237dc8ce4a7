"""What a replay measured: the summary, the tables by step index, the JSON document. No I/O.

Token and time figures count the steps that succeeded; ``requests`` counts every step.
Percentiles interpolate linearly between the closest ranks (numpy's default method).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from proxy.replay.records import StepRecord

SINGLE_STEPS = 12  # step indices up to this one get a row each; later ones are grouped
GROUP_WIDTH = 4


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _ok(steps: Iterable[StepRecord]) -> list[StepRecord]:
    return [s for s in steps if s.error is None]


def _tokens(steps: Iterable[StepRecord]) -> tuple[int, int]:
    prompt = cached = 0
    for step in steps:
        prompt += step.prompt_tokens or 0
        cached += step.cached_tokens or 0
    return prompt, cached


def summarize(steps: Sequence[StepRecord], wall_s: float) -> dict[str, Any]:
    ok = _ok(steps)
    prompt, cached = _tokens(ok)
    later_prompt, later_cached = _tokens(s for s in ok if s.step >= 1)
    # From step 2 on: after the step on which a system-prompt line is first seen to change,
    # which re-prefills once whatever the proxy does (issue 15: learned volatility).
    settled_prompt, settled_cached = _tokens(s for s in ok if s.step >= 2)
    ttfts = [s.ttft_s for s in ok if s.ttft_s is not None]
    e2es = [s.e2e_s for s in ok if s.e2e_s is not None]
    return {
        "requests": len(steps),
        "errors": len(steps) - len(ok),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "computed_tokens": prompt - cached,
        "cached_share": _share(cached, prompt),
        "cached_share_after_first_step": _share(later_cached, later_prompt),
        "cached_share_from_step_2": _share(settled_cached, settled_prompt),
        "ttft_p50_s": percentile(ttfts, 0.5),
        "ttft_p95_s": percentile(ttfts, 0.95),
        "e2e_p50_s": percentile(e2es, 0.5),
        "wall_s": wall_s,
        # Steps the server sent no usage for, or usage without cached tokens (vLLM needs
        # --enable-prompt-tokens-details): their tokens count as 0 above.
        "without_usage": sum(1 for s in ok if s.prompt_tokens is None),
        "without_cached_tokens": sum(
            1 for s in ok if s.prompt_tokens is not None and s.cached_tokens is None
        ),
    }


@dataclasses.dataclass(frozen=True)
class StepGroup:
    label: str
    requests: int
    prompt_tokens: int
    ttft_p50_s: float | None
    cached_share: float | None


def _group_of(index: int) -> tuple[int, int]:
    if index <= SINGLE_STEPS:
        return index, index
    first = SINGLE_STEPS + 1 + (index - SINGLE_STEPS - 1) // GROUP_WIDTH * GROUP_WIDTH
    return first, first + GROUP_WIDTH - 1


def by_step(
    steps: Sequence[StepRecord], *, grouped: bool = True
) -> dict[tuple[int, int], StepGroup]:
    """Figures per step index (later indices grouped in ranges unless ``grouped`` is off),
    keyed by the (first, last) index of each group, in order."""
    members: dict[tuple[int, int], list[StepRecord]] = {}
    for step in steps:
        key = _group_of(step.step) if grouped else (step.step, step.step)
        members.setdefault(key, []).append(step)
    groups = {}
    for key in sorted(members):
        ok = _ok(members[key])
        prompt, cached = _tokens(ok)
        first, last = key
        groups[key] = StepGroup(
            label=str(first) if first == last else f"{first}-{last}",
            requests=len(members[key]),
            prompt_tokens=prompt,
            ttft_p50_s=percentile([s.ttft_s for s in ok if s.ttft_s is not None], 0.5),
            cached_share=_share(cached, prompt),
        )
    return groups


def document(
    steps: Sequence[StepRecord], summary: Mapping[str, Any], config: Mapping[str, Any]
) -> dict[str, Any]:
    """What --json writes for one run."""
    return {
        "steps": [dataclasses.asdict(step) for step in steps],
        "summary": dict(summary),
        "config": dict(config),
    }


# Tables, markdown-friendly.


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:,.1f} ms"


def _pct(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.1f}%"


def _int(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


_ROWS = (  # (label, summary key, formatter, kind of difference)
    ("requests", "requests", _int, "count"),
    ("errors", "errors", _int, "count"),
    ("prompt tokens", "prompt_tokens", _int, "count"),
    ("cached tokens", "cached_tokens", _int, "count"),
    ("computed tokens", "computed_tokens", _int, "count"),
    ("cached share", "cached_share", _pct, "share"),
    ("cached share, steps >= 1", "cached_share_after_first_step", _pct, "share"),
    ("TTFT p50", "ttft_p50_s", _ms, "time"),
    ("TTFT p95", "ttft_p95_s", _ms, "time"),
    ("end-to-end p50", "e2e_p50_s", _ms, "time"),
    ("wall time", "wall_s", lambda s: "-" if s is None else f"{s:,.2f} s", "time"),
)


def _difference(kind: str, before: Any, after: Any) -> str:
    if before is None or after is None:
        return "-"
    delta = after - before
    if kind == "share":
        return f"{delta * 100:+.1f} pp"
    relative = f" ({delta / before * 100:+.1f}%)" if before else ""
    if kind == "time":
        return f"{delta * 1000:+,.1f} ms{relative}"
    return f"{delta:+,}{relative}"


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Markdown: the first column left-aligned, figures right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "|---|" + "|".join("---:" for _ in header[1:]) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def summary_table(runs: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """One column per run; with two runs, a third with the second minus the first."""
    header = ["metric", *(label for label, _ in runs)]
    compare = len(runs) == 2
    if compare:
        header.append(f"{runs[1][0]} - {runs[0][0]}")
    rows = []
    for label, key, show, kind in _ROWS:
        row = [label, *(show(summary.get(key)) for _, summary in runs)]
        if compare:
            row.append(_difference(kind, runs[0][1].get(key), runs[1][1].get(key)))
        rows.append(row)
    return _table(header, rows)


def step_table(runs: Sequence[tuple[str, Sequence[StepRecord]]]) -> str:
    """TTFT p50 and cached share by step index, one pair of columns per run."""
    per_run = [by_step(steps) for _, steps in runs]
    keys = sorted({key for groups in per_run for key in groups})
    several = len(runs) > 1
    header = ["step", "requests"]
    for label, _ in runs:
        suffix = f" ({label})" if several else ""
        header += [f"TTFT p50{suffix}", f"cached share{suffix}"]
    rows = []
    for key in keys:
        present = [groups[key] for groups in per_run if key in groups]
        row = [present[0].label, _int(present[0].requests)]
        for groups in per_run:
            group = groups.get(key)
            row += [_ms(group.ttft_p50_s), _pct(group.cached_share)] if group else ["-", "-"]
        rows.append(row)
    return _table(header, rows)
