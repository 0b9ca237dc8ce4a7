"""``chat_template_kwargs`` that change the rendered prompt, pinned for a session.

Llama 3.x templates print "Today Date: ..." from ``date_string`` (today's date when it is
not given): a client that passes the date, or an agent that runs past midnight, changes
the system block and so the whole prompt. The value first seen in a session is sent for
the rest of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.rewrite.detector import DEFAULT_DETECTOR, VolatileDetector
from proxy.rewrite.pipeline import Request, RewriteContext, transform

# Keys known to carry the current date or time into a template.
VOLATILE_KEYS = frozenset({"date_string", "current_date", "today", "now"})
# Switches the client sets on purpose, never pinned whatever their value looks like: a
# client turning thinking off means it.
CLIENT_SWITCHES = frozenset({"enable_thinking", "thinking", "reasoning", "reasoning_effort"})


def pinnable(kwargs: Any, detector: VolatileDetector = DEFAULT_DETECTOR) -> dict[str, Any]:
    """The part of a request's ``chat_template_kwargs`` a session should pin: the keys in
    ``VOLATILE_KEYS`` and any string value the detector finds volatile, except the
    ``CLIENT_SWITCHES``."""
    if kwargs is None or not isinstance(kwargs, Mapping):  # None first: the ABC check is not free
        return {}
    return {
        key: value
        for key, value in kwargs.items()
        if key not in CLIENT_SWITCHES
        and (key in VOLATILE_KEYS or (isinstance(value, str) and detector.finds(value)))
    }


@transform("pin_template_kwargs")
def pin_template_kwargs(request: Request, context: RewriteContext) -> Request | None:
    """The request with each pinnable template kwarg set to the session's pinned value
    where the two differ; None when nothing differs or the session pinned nothing. Keys
    the request does not send are not added (the client chose the template's default)."""
    pinned = context.pinned_template_kwargs
    kwargs = request.get("chat_template_kwargs")
    # The cheap checks first (most sessions pin nothing): the ABC check runs Python code.
    if not pinned or not isinstance(kwargs, dict) or not isinstance(pinned, Mapping):
        return None
    detector = (
        context.volatile if isinstance(context.volatile, VolatileDetector) else DEFAULT_DETECTOR
    )
    changed = {
        key: pinned[key]
        for key, value in pinnable(kwargs, detector).items()
        if key in pinned and not _same(pinned[key], value)
    }
    if not changed:
        return None
    return {**request, "chat_template_kwargs": {**kwargs, **changed}}


def _same(a: Any, b: Any) -> bool:
    # 1 == True == 1.0 in Python, but they render differently.
    return type(a) is type(b) and a == b
