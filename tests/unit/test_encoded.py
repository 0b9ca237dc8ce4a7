"""The forwarded array carried to a conversation's next request (proxy.encoded) is a
shortcut, not another answer: each step of a session forwards byte for byte what the
splice makes without it, however the client writes its JSON and whatever it changes."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import config, encoded, splice
from proxy.app import default_transforms
from proxy.bodies import BodyCache
from proxy.exchange import Exchange
from proxy.metrics import Metrics
from proxy.pieces import joined
from proxy.rewrite import Pipeline, RewriteContext
from proxy.rewrite.detector import VolatileDetector
from proxy.sessions import MemoryStore
from proxy.tracker import SessionTracker
from tests.unit.test_restore_carry import conversation, reply_of, steps
from tests.unit.test_splice import STYLES


class Proxy:
    """The chat route's request path in process: the body parsed as the continuation of
    the conversation's previous one, restored and rewritten, its reply recorded; each
    forwarded body encoded with the carried array and without it."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry

        self.detector = VolatileDetector()
        self.pipeline = Pipeline(default_transforms(config.Settings()))
        self.tracker = SessionTracker(
            MemoryStore(10, 60), self.detector, Metrics(CollectorRegistry())
        )
        self.bodies = BodyCache(64 << 20, min_body=0)
        # Per step: "spliced" one by one, its array "built" afresh or "carried" on from
        # the previous step's.
        self.steps: list[str] = []

    def send(self, body: bytes, reply: dict[str, Any]) -> bytes:
        return asyncio.run(self._send(body, reply))

    async def _send(self, body: bytes, reply: dict[str, Any]) -> bytes:
        parsed = self.bodies.parse(body)
        request, known = parsed.payload, parsed.known
        assert known is not None
        turn = await self.tracker.open({}, request, known=known)
        assert turn is not None
        context = RewriteContext(
            session=turn.session, volatile=self.detector, message_keys=turn.lookup_keys, known=known
        )
        forwarded = self.pipeline.apply(request, context).request
        messages = request["messages"]
        whole = splice.encode_pieces(forwarded, messages, body, parsed.spans, request)
        before = known.encoded
        shortcut = splice.encode_pieces(
            forwarded, messages, body, parsed.spans, request, turn.replaced_in, known
        )
        if parsed.kept is not None:  # as the chat route does: the array is counted
            self.bodies.recount(parsed.kept)
        made = known.encoded is not before
        self.steps.append("carried" if made and before else "built" if made else "spliced")
        assert joined(shortcut) == joined(whole)
        assert json.loads(joined(shortcut)) == forwarded
        exchange = Exchange("/v1/chat/completions", "POST", status=200)
        self.tracker.forward(turn, forwarded, exchange)
        exchange.usage = {"prompt_tokens": 10, "completion_tokens": 1}
        exchange.reply = reply
        await self.tracker.close(turn, exchange)
        await self.tracker.settled()
        return joined(shortcut)


@settings(max_examples=80, deadline=None)
@given(steps, st.sampled_from(STYLES), st.integers(0, 3))
def test_each_step_forwards_the_bytes_of_the_splice_without_it(
    plan: list[tuple[str, str, int]], style: dict[str, Any], min_replaced: int
) -> None:
    # (from few replaced messages on, so that short sessions take the shortcut too)
    with mock.patch.object(encoded, "MIN_REPLACED", min_replaced):
        proxy = Proxy()
        for body, reply in conversation(plan, style):
            proxy.send(body, reply)


def test_an_sdk_clients_session_builds_each_array_from_the_last() -> None:
    """The saving is real: with every reply sent back re-encoded (restored each step),
    each request from the first with MIN_REPLACED replies on takes the previous one's
    array; a clock moved in the system prompt does not stop it."""
    plan = [("arguments re-encoded", "clock" if n % 5 == 4 else "append", 0) for n in range(30)]
    proxy = Proxy()
    for body, reply in conversation(plan, STYLES[1]):
        forwarded = json.loads(proxy.send(body, reply))
    built = proxy.steps.index("built")
    assert built <= encoded.MIN_REPLACED + 1
    assert proxy.steps[built + 1 :] == ["carried"] * (len(plan) - built - 1)
    assistant = [m for m in forwarded["messages"] if m["role"] == "assistant"]
    assert assistant == [reply_of(step) for step in range(29)]


def test_the_body_cache_counts_the_array_it_keeps() -> None:
    """Against its bound, with the body it is kept for, and goes with it."""
    proxy = Proxy()
    plan = [("arguments re-encoded", "append", 0)] * (encoded.MIN_REPLACED + 3)
    for body, reply in conversation(plan, STYLES[0]):
        proxy.send(body, reply)
    cache = proxy.bodies
    [kept] = cache._lru
    array = kept.known.encoded
    assert array is not None and kept.extra == len(array.array) > 0
    assert cache.held == kept.size + kept.extra
    proxy.bodies._drop(kept)
    assert cache.held == 0
