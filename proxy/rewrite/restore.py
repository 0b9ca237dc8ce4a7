"""History restoration: messages the client sends back changed only in form are replaced by
what the proxy forwarded (or the engine emitted) for them before, byte for byte."""

from __future__ import annotations

import itertools
from typing import Any

from proxy.rewrite.pipeline import Request, RewriteContext, transform
from proxy.transcript import chain_keys


@transform("restore_history")
def restore_history(request: Request, context: RewriteContext) -> Request | None:
    """Frameworks re-serialize tool-call arguments, turn ``null`` content into ``""``, trim
    whitespace, drop reasoning: each such change breaks the engine's prefix cache from that
    message on. A message whose key (its meaning, up to those changes, and everything
    before it) matches a substitution the session recorded is sent as recorded. A change
    in meaning changes the key: the client's version goes as it is."""
    session = context.session
    messages = request.get("messages")
    if session is None or not session.substitutions or not isinstance(messages, list):
        return None
    restored: list[Any] | None = None
    keys = context.message_keys or chain_keys(messages, context.mask)
    substitutions = session.substitutions
    # The newest message is this request's input: the pipeline makes its forwarded form
    # afresh (a retry gets the same bytes again from the same transforms). The messages
    # with a substitution are found at C speed (a long history has thousands without).
    history = keys[: len(messages) - 1]
    for index in itertools.compress(range(len(history)), map(substitutions.__contains__, history)):
        replacement = substitutions[history[index]]
        if replacement != messages[index]:
            restored = restored if restored is not None else list(messages)
            restored[index] = replacement
    return None if restored is None else {**request, "messages": restored}
