"""History restoration carried from a request to the next (proxy.rewrite.restore.Carried):
a session's requests forward the very bytes they forward without it, whatever the client
sends back, and the carried result is taken only where it holds."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy import config, jsonio, record
from proxy.app import default_transforms
from proxy.bodies import BodyCache, Parsed
from proxy.exchange import Exchange
from proxy.metrics import Metrics
from proxy.rewrite import Pipeline, RewriteContext, restore
from proxy.rewrite.detector import VolatileDetector
from proxy.sessions import MemoryStore
from proxy.tracker import SessionTracker

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]


class Client:
    """The proxy's session path in process, each body parsed as the chat route does: as
    the continuation of the conversation's previous body (``continued``) or whole."""

    def __init__(self, *, continued: bool) -> None:
        from prometheus_client import CollectorRegistry

        self.detector = VolatileDetector()
        self.pipeline = Pipeline(default_transforms(config.Settings()))
        self.tracker = SessionTracker(
            MemoryStore(10, 60), self.detector, Metrics(CollectorRegistry())
        )
        self.bodies = BodyCache(64 << 20, min_body=0) if continued else None

    def send(self, body: bytes, reply: dict[str, Any], *, answered: bool = True) -> bytes:
        """What goes upstream for ``body``; ``answered``: the engine replied (else the
        request failed, and nothing is recorded)."""
        return asyncio.run(self._send(body, reply, answered))

    async def _send(self, body: bytes, reply: dict[str, Any], answered: bool) -> bytes:
        parsed = self.bodies.parse(body) if self.bodies is not None else Parsed(jsonio.loads(body))
        request = parsed.payload
        turn = await self.tracker.open({}, request, known=parsed.known)
        assert turn is not None
        context = RewriteContext(
            session=turn.session,
            volatile=self.detector,
            message_keys=turn.lookup_keys,
            known=parsed.known,
        )
        if self.bodies is not None:  # restoration itself, carried and in full, the same
            full = dataclasses.replace(context, known=None)
            assert same(
                restore.restore_history(request, context), restore.restore_history(request, full)
            )
        forwarded = self.pipeline.apply(request, context).request
        exchange = Exchange("/v1/chat/completions", "POST", status=200)
        self.tracker.forward(turn, forwarded, exchange)
        self.tracker.prepare(turn)  # as while the engine reads the request
        exchange.usage = {"prompt_tokens": 10, "completion_tokens": 1}
        exchange.reply = reply
        if answered:
            await self.tracker.close(turn, exchange)
        await self.tracker.settled()
        return jsonio.dumps(forwarded["messages"])

    def records(self) -> list[list[tuple[bytes, bytes]]]:
        """Each stored session's substitutions, in order, as bytes."""
        sessions = self.tracker.store._sessions.values()  # type: ignore[attr-defined]
        return [
            [(key, jsonio.dumps(message)) for key, message in session.substitutions.items()]
            for session in sessions
        ]


def same(one: dict[str, Any] | None, other: dict[str, Any] | None) -> bool:
    """Whether two results of restoration are None, or hold the very same messages."""
    if one is None or other is None:
        return one is other
    pairs = zip(one["messages"], other["messages"], strict=True)
    return all(a is b for a, b in pairs)


def reply_of(step: int) -> dict[str, Any]:
    """What the model says at ``step``: a tool call, as vLLM writes it."""
    call = {
        "id": f"call_{step}",
        "type": "function",
        "function": {"name": "lookup", "arguments": json.dumps({"q": step})},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def sent_back(reply: dict[str, Any], how: str) -> dict[str, Any]:
    """The reply as a client sends it back: as it came, or in another form."""
    if how == "as emitted":
        return reply
    if how == "empty content":
        return {**reply, "content": ""}
    call = reply["tool_calls"][0]
    arguments = json.dumps(json.loads(call["function"]["arguments"]), indent=1)
    function = {**call["function"], "arguments": arguments}
    return {**reply, "tool_calls": [{**call, "function": function}]}


# What a client does at a step: how it sends the reply back, and what else it does.
steps = st.lists(
    st.tuples(
        st.sampled_from(["as emitted", "empty content", "arguments re-encoded"]),
        st.sampled_from(["append", "append", "append", "clock", "edit", "trim"]),
        st.integers(0, 30),
    ),
    min_size=1,
    max_size=10,
)


def conversation(
    plan: list[tuple[str, str, int]], style: dict[str, Any] | None = None
) -> list[tuple[bytes, dict[str, Any]]]:
    """(body, the model's reply) per step of a client following ``plan`` and writing its
    JSON in ``style`` (json.dumps's arguments): each step sends the reply back in some
    form and a tool's result, and may move a clock in the system prompt, edit an earlier
    message, or go back."""
    # (long enough for the body cache to keep the first body: proxy.bodies.HEAD)
    system = {"role": "system", "content": "Help with flights. " * 20 + "\nNow: 10:00"}
    messages: list[dict[str, Any]] = [system, {"role": "user", "content": "change my flight"}]
    exchanges = []
    for step, (how, also, at) in enumerate(plan):
        body = {"model": "m", "tools": TOOLS, "messages": messages}
        reply = reply_of(step)
        exchanges.append((json.dumps(body, **(style or {})).encode(), reply))
        result = {"role": "tool", "tool_call_id": f"call_{step}", "content": f"résult {step}"}
        messages = [*messages, sent_back(reply, how), result]
        if also == "clock":
            clock = system["content"].replace("10:00", f"10:{step:02d}")
            messages[0] = {**system, "content": clock}
        elif also == "edit" and len(messages) > 3:
            index = 2 + at % (len(messages) - 3)
            messages[index] = {**messages[index], "content": f"edited {step}"}
        elif also == "trim" and len(messages) > 4:
            messages = messages[: max(3, len(messages) - 1 - at % 3)]
            messages.append({"role": "user", "content": f"again {step}"})
    return exchanges


@settings(max_examples=60, deadline=None)
@given(steps)
def test_carried_restoration_forwards_the_bytes_of_the_full_one(
    plan: list[tuple[str, str, int]],
) -> None:
    """And each step records the same (proxy.record, from the previous step's result)."""
    continued, whole = Client(continued=True), Client(continued=False)
    for body, reply in conversation(plan):
        assert continued.send(body, reply) == whole.send(body, reply)
        assert continued.records() == whole.records()


def test_a_step_that_continues_the_last_takes_its_restoration(monkeypatch) -> None:
    """The saving is real: a client that keeps its history and sends the replies back
    re-encoded has each step take the previous one's result (and so look up only its new
    messages), and still gets every reply restored."""
    taken = []
    carried = restore._carried

    def counting(known: Any, *args: Any) -> Any:
        found = carried(known, *args)
        if known is not None:  # (the harness also restores without, to compare)
            taken.append(found is not None)
        return found

    monkeypatch.setattr(restore, "_carried", counting)
    client = Client(continued=True)
    plan = [("arguments re-encoded", "append", 0)] * 6
    for body, reply in conversation(plan):
        forwarded = json.loads(client.send(body, reply))
    # From the second request on (the first has no record to restore from), each takes it.
    assert taken == [True] * 10  # (the harness restores once more, to compare)
    emitted = [reply_of(step) for step in range(5)]
    assert [m for m in forwarded if m["role"] == "assistant"] == emitted


def test_a_step_that_continues_the_last_works_out_its_record_from_it(monkeypatch) -> None:
    """Where it records, too: each step after the first takes the previous one's result,
    and records every reply in the form the model emitted it."""
    taken = []
    carry = record._carry

    def counting(*args: Any) -> Any:
        found = carry(*args)
        taken.append(found is not None)
        return found

    monkeypatch.setattr(record, "_carry", counting)
    continued, whole = Client(continued=True), Client(continued=False)
    for body, reply in conversation([("arguments re-encoded", "append", 0)] * 6):
        continued.send(body, reply)
        whole.send(body, reply)
    assert taken[::2] == [False] + [True] * 5
    assert not any(taken[1::2])  # (``whole`` has nothing carried)
    [substitutions] = [kept for kept in continued.records() if kept]
    emitted = [jsonio.dumps(reply_of(step)) for step in range(6)]
    assert [message for _, message in substitutions if b"tool_calls" in message] == emitted


def test_a_step_after_another_record_looks_everything_up() -> None:
    """A record saved by another request in between (a retry, a sub-agent) is not the one
    the carried result was worked out for: the next step restores from the record."""
    exchanges = conversation([("arguments re-encoded", "append", 0)] * 4)
    continued, whole = Client(continued=True), Client(continued=False)
    for client in (continued, whole):
        for body, reply in exchanges[:3]:
            client.send(body, reply)
        asyncio.run(record_elsewhere(client))
    assert continued.send(*exchanges[3]) == whole.send(*exchanges[3])
    assert continued.records() == whole.records()
    assert b"recorded elsewhere" in whole.send(*exchanges[3])


async def record_elsewhere(client: Client) -> None:
    """Another request of the session records another form of the first reply."""
    store = client.tracker.store
    [key] = [key for key in store._sessions if key.startswith("f:")]
    session = await store.get(key)
    assert session is not None
    first = next(iter(session.substitutions))
    session.substitute(first, {**session.substitutions[first], "content": "recorded elsewhere"})
    assert await store.save(session)


def test_a_step_after_a_failed_one_takes_nothing_from_before_it() -> None:
    """A step whose request failed records nothing, so the record is still the one the
    step before it saved; but the failed step changed a reply in form only (the same key),
    and the step after continues the failed one: the result carried from before the
    failed step is not for these messages."""
    exchanges = conversation([("as emitted", "append", 0)] * 3)
    body, reply = exchanges[2]
    request = json.loads(body)
    request["messages"][2] = {**request["messages"][2], "refusal": None}
    changed = json.dumps(request).encode()
    grown = {**request, "messages": [*request["messages"], {"role": "user", "content": "?"}]}
    continued, whole = Client(continued=True), Client(continued=False)
    for client in (continued, whole):
        client.send(*exchanges[0])
        client.send(*exchanges[1])
        client.send(changed, reply, answered=False)
    assert continued.send(json.dumps(grown).encode(), reply) == whole.send(
        json.dumps(grown).encode(), reply
    )


def test_a_carried_result_once_saved_is_a_copy_with_its_record() -> None:
    carry = restore.Carried([{"role": "user"}], 0, b"k", [], [], [])
    saved = carry.once_saved((3, b"link"))
    assert saved == dataclasses.replace(carry, saved=(3, b"link"))
    assert carry.saved is None and saved.client is carry.client
