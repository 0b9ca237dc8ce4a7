"""Bounds that show a request cannot reach the soft watermark, with little or no counting.

Compaction must know whether a request is past the soft watermark (a summary starts) or
the high one (an event). Far below both, the exact count does not matter: a bound that
shows it goes on as the count would (tests/unit/test_compaction_properties.py runs both
paths). The bounds, cheapest first: the body's bytes (a token is at least a byte); the
engine's count of the session's last exchange plus the new messages' bytes; then counts
of the oldest uncounted messages, kept for later steps. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from proxy import jsonio, tool_forms
from proxy.compaction.budget import PER_MESSAGE, Budget, Sizer
from proxy.compaction.state import Compaction
from proxy.transcript import matched_messages

if TYPE_CHECKING:
    from proxy.turn import Turn

# Bytes a rewrite adds besides whole messages: the tool-batching instruction (130) and a
# context note's header.
REWRITE_MARGIN = 512


# Replaced messages past which the engine's count is tried before the body's bytes.
FEW_REPLACED = 16

# Counting stops this far under the soft watermark, so the next steps' new messages fit
# under it by their bytes without counting again at once.
COUNTED_HEADROOM = 0.8


def may_skip(state: Compaction, turn: Turn, messages: list[Any]) -> bool:
    """Whether a bound may show this request cannot reach the soft watermark, so that it
    goes on as it would after counting. Not for a session with something folded or
    elided (its view must be applied), nor without the body's size."""
    if state.cut_key is not None or state.elided or state.unreported or not turn.body_bytes:
        return False
    return len(turn.client_messages) == len(messages) and len(turn.keys) == len(messages)


def bounded_below(
    state: Compaction, turn: Turn, messages: list[Any], budget: Budget, tools: Any
) -> bool:
    """Under the soft watermark by a bound that needs no tokenizer: a token is at least
    one byte, so the estimate is at most the client's body in bytes, plus the bytes of
    each message the rewrites replaced (a restored reply, a message that carries a note),
    plus each message's framing; or by the engine's count of the last exchange. Counting
    (tiktoken about 18 MB/s, the bpe crate 1.4-2.5x that) was most of a big request's
    cost, and a proxy that never counts never loads the encoding (tokens.Lazy). The
    cheaper bound first: the body's, unless the rewrites replaced many messages (a client
    that sends every reply back re-encoded has each one restored: 1,700 at 1 MB, whose
    bytes took 0.86 ms), then the engine's, whose cost grows with the new messages."""
    first, then = _below_by_bytes, _below_by_engine_count
    if turn.replaced_more_than(messages, FEW_REPLACED):
        first, then = then, first
    return first(state, turn, messages, budget, tools) or then(state, turn, messages, budget, tools)


def _below_by_bytes(
    state: Compaction, turn: Turn, messages: list[Any], budget: Budget, tools: Any
) -> bool:
    """The body's bytes, the replaced messages' and the framing (``bounded_below``; the
    tools are in the body's bytes)."""
    rewritten = sum(_utf8_bytes(messages[index]) for index in turn.replaced_in(messages))
    bound = turn.body_bytes + rewritten + REWRITE_MARGIN + len(messages) * PER_MESSAGE
    return bound * max(state.ratio, 1.0) <= budget.soft


def _below_by_engine_count(
    state: Compaction, turn: Turn, messages: list[Any], budget: Budget, tools: Any
) -> bool:
    """The same bound from the engine's own count: the messages this request shares with
    the session's last exchange (its forwarded messages and reply, by exact hash chain;
    with the same tools) are at most that exchange's prompt and completion tokens as the
    engine reported them, and the rest is bounded by its bytes. A long session's step so
    needs no tokenizer until its prompt nears the watermark (counting the new messages
    of a 1 MB history cost a third of a step, tests/benchmarks/overhead.py)."""
    session = turn.session
    if not session.last_prompt_tokens or not session.last_chain:
        return False
    if tool_forms.forms(tools).digest != session.last_tools:
        return False
    shared = matched_messages(turn.exact_chain(messages), session.last_chain)
    added = sum(_utf8_bytes(m) + PER_MESSAGE for m in messages[shared:])
    added += REWRITE_MARGIN  # what a rewrite may add to the new messages
    engine = session.last_prompt_tokens + session.last_completion_tokens
    return engine + added * max(state.ratio, 1.0) <= budget.soft


def counted_far_below(
    state: Compaction,
    keys: Sequence[bytes],
    messages: list[Any],
    budget: Budget,
    sizer: Sizer,
    tools: Any,
) -> bool:
    """The same with counts: a message the session counted before by its count, one not
    counted yet by its bytes. Over the watermark so, the oldest uncounted messages are
    counted (kept for later requests) until the bound is well under it (COUNTED_HEADROOM):
    a new session counts about as much of its history as it must, and a long session's
    step mostly nothing, now and then a stretch of its newer messages."""
    counted = state.sizes
    soft = budget.soft / max(state.ratio, 1.0)
    bound = sizer.tools(tools) + REWRITE_MARGIN
    uncounted: list[tuple[int, int]] = []  # (index, its bytes bound)
    for index, (message, key) in enumerate(zip(messages, keys, strict=True)):
        size = counted.get(key)
        if size is None:
            size = _utf8_bytes(message) + PER_MESSAGE
            uncounted.append((index, size))
        bound += size
    if bound > soft:  # count until well under it: the next steps then count nothing
        for index, upper in uncounted:
            size = counted[keys[index]] = sizer.message(messages[index])
            bound -= upper - size
            if bound <= soft * COUNTED_HEADROOM:
                break
    sizer.prune(counted, keys)
    return bound <= soft


def _utf8_bytes(message: Any) -> int:
    """At least the bytes of what Sizer counts of ``message`` (its content, its calls)."""
    if not isinstance(message, dict):
        return 0
    total = 0
    for value in (message.get("content"), message.get("tool_calls")):
        if isinstance(value, str):
            total += len(value) if value.isascii() else len(value.encode())
        elif value is not None:
            total += len(jsonio.dumps(value))
    return total
