"""Agent traces: read the JSONL trace format and enumerate the requests to replay.

Semantics (proxy/replay/bundled/README.md): for each assistant message k not listed in
``meta.injected_assistant_idx``, the agent sent ``messages[:k]`` with ``tools`` and
``meta.request`` and the model answered ``messages[k]``. Messages after the last assistant
message were never sent to the model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from proxy import jsonio

# Traces that ship with the package, by short name (`prefill-proxy replay --traces dev`).
BUNDLED_DIR = Path(__file__).parent / "bundled"
BUNDLED = {"dev": BUNDLED_DIR / "dev.jsonl"}


class TraceError(ValueError):
    """A trace line that is not a conversation in the expected format."""


def bundled(name: str) -> Path:
    """The path of a bundled trace file by its short name."""
    return BUNDLED[name]


def locate(name_or_path: str | Path) -> Path:
    """A trace file given as a path, or as the short name of a bundled one (a file of that
    name in the working directory wins)."""
    path = Path(name_or_path)
    if not path.exists() and str(name_or_path) in BUNDLED:
        return BUNDLED[str(name_or_path)]
    return path


@dataclasses.dataclass(frozen=True)
class Conversation:
    id: str
    source: str
    tools: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    request: dict[str, Any]  # the agent's sampling parameters (meta.request)
    injected: frozenset[int]  # assistant messages the model did not produce


@dataclasses.dataclass(frozen=True)
class Step:
    """One model call: the agent sent ``messages[:position]``; the model answered
    ``messages[position]``."""

    conversation: Conversation
    index: int  # 0-based among the conversation's requested steps
    position: int

    @property
    def messages(self) -> list[dict[str, Any]]:
        return self.conversation.messages[: self.position]

    @property
    def reply(self) -> dict[str, Any]:
        return self.conversation.messages[self.position]

    @property
    def after_tool(self) -> bool:
        """The step answers tool results: the client ran tools just before sending it."""
        return self.position > 0 and self.conversation.messages[self.position - 1]["role"] == "tool"


def parse(record: Mapping[str, Any]) -> Conversation:
    """One trace line (already decoded) as a Conversation."""
    messages = record.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise TraceError(f"trace {record.get('id')!r}: 'messages' must be a list of objects")
    meta = record.get("meta") or {}
    return Conversation(
        id=str(record.get("id", "")),
        source=str(record.get("source", "")),
        tools=list(record.get("tools") or []),
        messages=messages,
        request=dict(meta.get("request") or {}),
        injected=frozenset(meta.get("injected_assistant_idx") or ()),
    )


def load(path: Path, limit: int | None = None) -> list[Conversation]:
    """The conversations of a JSONL trace file, in file order (the first ``limit``)."""
    conversations: list[Conversation] = []
    with path.open("rb") as lines:
        for number, line in enumerate(lines, 1):
            if limit is not None and len(conversations) >= limit:
                break
            if not line.strip():
                continue
            try:
                record = jsonio.loads(line)
            except jsonio.InvalidJSON as exc:
                raise TraceError(f"{path}:{number}: not JSON ({exc})") from exc
            if not isinstance(record, dict):
                raise TraceError(f"{path}:{number}: not a JSON object")
            conversations.append(parse(record))
    return conversations


def steps(conversation: Conversation) -> list[Step]:
    """The model calls of a conversation, in order."""
    positions = [
        k
        for k, message in enumerate(conversation.messages)
        if message.get("role") == "assistant" and k not in conversation.injected and k > 0
    ]
    return [Step(conversation, index, k) for index, k in enumerate(positions)]


def count_steps(conversations: Iterable[Conversation]) -> int:
    return sum(len(steps(conversation)) for conversation in conversations)
