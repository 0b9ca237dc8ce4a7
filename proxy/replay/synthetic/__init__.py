"""Synthetic agent conversations, shaped like the recorded traces in proxy/replay/bundled: a
~7k-character system prompt, 14 tools with JSON schemas, about 12 model calls (or as many
as asked, for long sessions), some assistant messages with 2-3 parallel tool calls, tool
results about a third of the content. Conversations alternate between two made-up support
desks, so several share a system prompt and tools, as the real ones do. Seeded and
deterministic, no network; each conversation is a trace record, so the replay runs them
like the real traces.
"""

from __future__ import annotations

from typing import Any

from proxy.replay.synthetic.generator import DESKS, conversation
from proxy.replay.traces import Conversation, parse

__all__ = ["DESKS", "conversations", "generate"]


def generate(count: int, seed: int = 0, steps: int | None = None) -> list[dict[str, Any]]:
    """``count`` trace records. Conversation i depends only on (seed, i, steps), so a
    longer set starts with a shorter one. ``steps``: about that many model calls each
    (long sessions) instead of 8 to 14."""
    return [conversation(seed, index, steps) for index in range(count)]


def conversations(count: int, seed: int = 0, steps: int | None = None) -> list[Conversation]:
    return [parse(record) for record in generate(count, seed, steps)]
