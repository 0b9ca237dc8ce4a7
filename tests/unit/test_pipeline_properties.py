"""The whole default pipeline, with a session that has seen the conversation before:
for any conversation, valid or not, it never raises, is deterministic, keeps a valid
conversation valid and loses no text (DESIGN.md invariants 1, 2, 4, 7)."""

from __future__ import annotations

import copy

from hypothesis import given, settings

from proxy import config, prefix
from proxy.app import default_transforms
from proxy.rewrite import Pipeline, RewriteContext
from proxy.rewrite.detector import DEFAULT_DETECTOR
from proxy.sessions import Session
from tests.support.conversations import (
    any_conversations,
    conversations,
    is_valid_conversation,
    texts_of,
)

PIPELINE = Pipeline(default_transforms(config.Settings()))


def context_after_one_step(messages: object) -> RewriteContext:
    """A session that forwarded this conversation's first half and got a reply."""
    session = Session("s")
    half = messages[: len(messages) // 2] if isinstance(messages, list) else []
    reply = {"role": "assistant", "content": "ok"}
    prefix.remember(session, half, half, None, reply, 10, 2, DEFAULT_DETECTOR.mask)
    return RewriteContext(session=session, volatile=DEFAULT_DETECTOR)


@settings(max_examples=200, deadline=None)
@given(conversations())
def test_valid_stays_valid_deterministic_nothing_lost(messages: list) -> None:
    request = {"model": "m", "messages": messages}
    original = copy.deepcopy(request)
    context = context_after_one_step(messages)
    result = PIPELINE.apply(request, context)
    assert request == original  # not mutated
    assert result.failed == ()
    assert PIPELINE.apply(copy.deepcopy(original), context) == result  # deterministic
    out = result.request["messages"]
    assert is_valid_conversation(out)
    produced = "\n".join(texts_of(out))
    for text in texts_of(messages):
        for line in text.split("\n"):
            assert line.strip() in produced  # moved, maybe, but never lost


@settings(max_examples=200, deadline=None)
@given(any_conversations())
def test_malformed_input_never_fails_the_request(messages: object) -> None:
    request = {"model": "m", "messages": messages}
    result = PIPELINE.apply(request, context_after_one_step(messages))
    assert result.failed == ()
