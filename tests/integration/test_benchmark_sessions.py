"""The overhead benchmark's sessions, through the proxy in process: what each kind makes
the proxy do (tests/benchmarks/overhead.py)."""

from __future__ import annotations

import pytest

from tests.benchmarks.overhead import AgentSessions

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(("replies_back", "reason"), [(True, "none"), (False, "history_rewritten")])
async def test_each_kind_of_session_continues_its_prefix_as_described(
    make_proxy, replies_back: bool, reason: str
) -> None:
    """Sending the replies back, every step continues the previous prompt and reply (each
    reply found as recorded); with the client's own tool calls, every step parts from the
    recorded reply."""
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
