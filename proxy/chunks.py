"""Reading OpenAI chat-completion stream chunks: which ones carry generated tokens."""

from __future__ import annotations

from typing import Any


def carries_token(choice: Any) -> bool:
    """Whether a chunk's choice carries generated output (content, a tool-call piece or
    reasoning); the role-only first chunk and the finish chunk do not."""
    delta = choice.get("delta") if isinstance(choice, dict) else None
    if not isinstance(delta, dict):
        return False
    return bool(
        delta.get("content")
        or delta.get("tool_calls")
        or delta.get("reasoning_content")
        or delta.get("reasoning")
    )
