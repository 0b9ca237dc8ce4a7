"""The overhead benchmark's sessions, through the proxy in process: what each kind makes
the proxy do (tests/benchmarks/overhead.py)."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks.overhead import AgentSessions
from tests.support.fake_upstream import completion_body

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("replies_back", "reason"), [("exact", "none"), ("sdk", "none"), ("", "history_rewritten")]
)
async def test_each_kind_of_session_continues_its_prefix_as_described(
    make_proxy, replies_back: str, reason: str
) -> None:
    """Sending the replies back, every step continues the previous prompt and reply (each
    reply found as recorded, and restored where the client changed its form); with the
    client's own tool calls, every step parts from the recorded reply."""
    proxy = make_proxy()
    sessions = AgentSessions(8 * 1024, False, 600, per_session=4, replies_back=replies_back)
    for number in range(sessions.session_length):
        body = sessions.body(0, number)
        answer = await proxy.client.post(
            "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )
        assert answer.status_code == 200
    steps = sessions.session_length - 1
    assert proxy.sample("prefill_proxy_prefix_breaks_total", reason=reason) == steps
    if replies_back:  # each reply goes as the upstream emitted it
        forwarded = json.loads(proxy.seen[-1].content)["messages"]
        replies = [m for m in forwarded if m["role"] == "assistant"]
        emitted = json.loads(completion_body())["choices"][0]["message"]
        assert replies == [emitted] * steps
        # (the SDK's form, restored: its null fields are what the client sent)
        sent = json.loads(sessions.body(0, sessions.session_length - 1))["messages"]
        assert ("refusal" in sent[2]) == (replies_back == "sdk")
