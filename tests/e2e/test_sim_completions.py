"""The simulator's /v1/completions over real HTTP: token-id prompts share the prefix cache
with chat requests, as in vLLM (what the proxy's warm-ups rely on)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from proxy.sim.app import create_sim_app
from proxy.sim.config import SimConfig
from tests.support.servers import serve

MESSAGES = [
    {"role": "system", "content": "You answer questions about orders. " * 40},
    {"role": "user", "content": "Where is order 17?"},
]


@pytest.fixture
def sim() -> Iterator[httpx.Client]:
    app = create_sim_app(SimConfig(speed=1000.0, max_model_len=4096))
    with serve(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def tokens(sim: httpx.Client, generation: bool) -> list[int]:
    body = {"messages": MESSAGES, "add_generation_prompt": generation}
    return sim.post("/tokenize", json=body).json()["tokens"]


def test_token_ids_warm_the_cache_a_chat_request_then_finds(sim) -> None:
    prompt = tokens(sim, generation=False)
    sent = (len(prompt) - 1) // 16 * 16 + 1
    response = sim.post("/v1/completions", json={"prompt": prompt[:sent], "max_tokens": 1})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "text_completion" and body["model"] == "sim-model"
    assert body["choices"][0]["finish_reason"] == "length"
    assert isinstance(body["choices"][0]["text"], str)
    usage = body["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (sent, 1)
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    chat = sim.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2}).json()
    assert chat["usage"]["prompt_tokens_details"]["cached_tokens"] == sent - 1


def test_a_text_prompt_gets_sixteen_tokens_by_default(sim) -> None:
    body = sim.post("/v1/completions", json={"model": "sim-model", "prompt": "Once upon"}).json()
    assert body["usage"]["completion_tokens"] == 16
    assert body["usage"]["prompt_tokens"] == len(
        sim.post("/tokenize", json={"prompt": "Once upon"}).json()["tokens"]
    )


def test_cache_salt_keeps_token_prompts_apart(sim) -> None:
    prompt = tokens(sim, generation=True)
    first = {"prompt": prompt, "max_tokens": 1, "cache_salt": "a"}
    sim.post("/v1/completions", json=first)
    again = sim.post("/v1/completions", json=first).json()["usage"]
    other = sim.post("/v1/completions", json={**first, "cache_salt": "b"}).json()["usage"]
    assert again["prompt_tokens_details"]["cached_tokens"] > 0
    assert other["prompt_tokens_details"]["cached_tokens"] == 0


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"prompt": [1, 2, 3], "max_tokens": 0}, 400, "max_tokens must be at least 1, got 0"),
        ({"prompt": [1, 2], "stream": True}, 400, "does not stream"),
        ({"prompt": [[1, 2], [3]]}, 400, "one prompt"),
        ({"prompt": []}, 400, "one prompt"),
        ({}, 400, "prompt: Field required"),
        ({"prompt": [1], "model": "other"}, 404, "does not exist"),
    ],
)
def test_what_the_simulator_refuses(sim, body: dict, status: int, message: str) -> None:
    response = sim.post("/v1/completions", json=body)
    assert response.status_code == status
    assert message in response.json()["error"]["message"]
