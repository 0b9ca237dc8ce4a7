"""The replay's picture: TTFT p50 and cached share by step index, one line per run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from proxy.replay import report
from proxy.replay.records import StepRecord


class PlotUnavailable(RuntimeError):
    pass


def require() -> None:
    """Fail now, not after a long replay, when matplotlib is missing."""
    _pyplot()


def _pyplot() -> Any:
    try:  # an optional dependency, and slow to import: only when a plot is asked for
        import matplotlib

        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable(
            "--plot needs matplotlib: pip install 'prefill-proxy[bench]'"
        ) from exc
    return plt


def draw(runs: Sequence[tuple[str, Sequence[StepRecord]]], path: Path, title: str = "") -> None:
    """Write a PNG with two panels sharing the step-index axis."""
    plt = _pyplot()
    figure, (ttft, cached) = plt.subplots(2, 1, sharex=True, figsize=(8, 6.5))
    for number, (label, steps) in enumerate(runs):
        groups = report.by_step(steps, grouped=False)
        indices = [first for first, _ in groups]
        # Runs often coincide (proxied = direct): dashes and other markers keep both visible.
        style = {"label": label, "marker": "os^v"[number % 4], "linestyle": ("-", "--")[number % 2]}
        ttft.plot(indices, [_ms(g.ttft_p50_s) for g in groups.values()], **style)
        cached.plot(indices, [_pct(g.cached_share) for g in groups.values()], **style)
    ttft.set_ylabel("TTFT p50 (ms)")
    ttft.set_ylim(bottom=0)
    cached.set_ylabel("cached share of prompt (%)")
    cached.set_ylim(0, 100)
    cached.set_xlabel("step index in conversation")
    for axes in (ttft, cached):
        axes.grid(True, alpha=0.3)
        axes.legend()
    if title:
        ttft.set_title(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _ms(seconds: float | None) -> float:
    return float("nan") if seconds is None else seconds * 1000


def _pct(share: float | None) -> float:
    return float("nan") if share is None else share * 100
