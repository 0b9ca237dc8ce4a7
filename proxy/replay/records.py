"""What a replay records: one row per step, and a run's rows with its wall time."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class StepRecord:
    conversation: str
    step: int  # index among the conversation's requested steps, from 0
    messages: int  # how many messages the request carried
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    ttft_s: float | None = None  # until the first content, tool-call or reasoning event
    e2e_s: float | None = None  # until the end of the stream
    status: int | None = None  # HTTP status; None when no response came
    error: str | None = None
    compaction: str | None = None  # the proxy's compaction header: elide, summary, fallback
    proxy_overhead_ms: float | None = None  # the proxy's own overhead header, if any


@dataclasses.dataclass(frozen=True)
class Run:
    steps: list[StepRecord]  # conversation order, then step order
    wall_s: float
