"""Speculative prefill: while the client runs its tools, the engine computes the next
step's known prefix, so that only the tool results are left to prefill when it comes back.

``shape``: what a warm-up sends, and why (measured on vLLM); ``policy``: when, and when
not (pure decisions); ``warmer``: the ReplyListener that does it in the background.
"""

from proxy.warmup.warmer import Warmer

__all__ = ["Warmer"]
