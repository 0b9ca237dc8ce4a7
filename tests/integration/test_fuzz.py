"""Random bodies, well-formed JSON of every odd shape, at the chat and Responses routes:
the proxy never answers 500 (a bug); each answer is the upstream's or a 4xx in OpenAI's
shape. The upstream answers every request it gets, as vLLM would have to."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROLES = st.sampled_from(["system", "developer", "user", "assistant", "tool", "function", "", 3])
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)
part = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", "input_text", "x", 1])},
    optional={"text": json_values, "image_url": json_values},
)
content = st.none() | st.text(max_size=40) | st.lists(part | json_values, max_size=3) | json_values
call = st.fixed_dictionaries(
    {"id": json_values, "type": st.just("function")},
    optional={
        "function": st.fixed_dictionaries(
            {"name": json_values, "arguments": st.text(max_size=20) | json_values}
        )
    },
)
message = st.fixed_dictionaries(
    {"role": ROLES},
    optional={
        "content": content,
        "tool_calls": st.lists(call, max_size=2) | json_values,
        "tool_call_id": json_values,
        "name": json_values,
        "reasoning_content": json_values,
    },
)
tool = st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "x"])},
    optional={
        "function": st.fixed_dictionaries(
            {"name": json_values}, optional={"parameters": json_values, "description": json_values}
        )
    },
)
chat_body = st.fixed_dictionaries(
    {"model": json_values, "messages": st.lists(message | json_values, max_size=6) | json_values},
    optional={
        "tools": st.lists(tool | json_values, max_size=3) | json_values,
        "stream": json_values,
        "stream_options": json_values,
        "parallel_tool_calls": json_values,
        "chat_template_kwargs": json_values,
        "user": json_values,
        "prompt_cache_key": json_values,
    },
)
responses_body = st.fixed_dictionaries(
    {"model": json_values, "input": st.text(max_size=20) | st.lists(json_values, max_size=4)},
    optional={"instructions": json_values, "tools": json_values, "stream": json_values},
)


def answer(request: httpx.Request) -> httpx.Response:
    body = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1},
    }
    return httpx.Response(200, json=body)


def check(response: httpx.Response) -> None:
    assert response.status_code != 500, response.text
    if response.status_code >= 400:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def proxy() -> Any:
    """One proxy for every example (sessions accumulate, as in production)."""
    from prometheus_client import CollectorRegistry

    from proxy import config
    from proxy.app import create_app
    from tests.integration.conftest import Harness

    settings_ = config.load({"upstream": "http://engine", "context_limit": 4096}, environ={})
    registry = CollectorRegistry()
    app = create_app(settings_, transport=httpx.MockTransport(answer), registry=registry)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy")
    return Harness(registry, [], client)


FUZZ = settings(
    max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.mark.anyio
@FUZZ
@given(body=chat_body)
async def test_chat_bodies_never_get_a_500(proxy: Any, body: dict[str, Any]) -> None:
    check(await proxy.client.post("/v1/chat/completions", content=json.dumps(body)))
    assert proxy.sample("prefill_proxy_in_flight_requests") == 0
    assert proxy.sample("prefill_proxy_internal_errors_total", route="/v1/chat/completions") == 0


@pytest.mark.anyio
@FUZZ
@given(body=responses_body)
async def test_responses_bodies_never_get_a_500(proxy: Any, body: dict[str, Any]) -> None:
    check(await proxy.client.post("/v1/responses", content=json.dumps(body)))
