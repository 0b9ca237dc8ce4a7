"""A cache-aware router in front of the engines: the proxy tells it the session (its key
in upstream_session_header) and hands back the affinity token it gave the session
(upstream_affinity_header, as llm-d's session-affinity scorer expects)."""

from __future__ import annotations

from typing import Any

import httpx
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from proxy import config
from proxy.app import create_app
from tests.support.servers import serve


class Router:
    """An upstream that records the headers it gets and issues an affinity token."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        self.app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])

    async def chat(self, request: Request) -> JSONResponse:
        self.seen.append(dict(request.headers))
        reply = {"role": "assistant", "content": f"answer {len(self.seen)}"}
        body = {
            "id": "c",
            "object": "chat.completion",
            "model": "m",
            "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        }
        token = request.headers.get("x-session-token") or f"pod-{len(self.seen)}"
        return JSONResponse(body, headers={"x-session-token": token})


def conversation(url: str, steps: int, **headers: str) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You book flights."},
        {"role": "user", "content": "Book me a flight to Lisbon."},
    ]
    with httpx.Client(base_url=url, timeout=10) as client:
        for step in range(steps):
            reply = client.post(
                "/v1/chat/completions", json={"model": "m", "messages": history}, headers=headers
            )
            reply.raise_for_status()
            history += [
                reply.json()["choices"][0]["message"],
                {"role": "user", "content": f"{step}"},
            ]
    return history


def test_the_router_sees_one_key_per_session_and_gets_its_token_back() -> None:
    router = Router()
    with serve(router.app) as upstream:
        settings = config.load(
            {
                "upstream": upstream,
                "upstream_session_header": "X-Session-ID",
                "upstream_affinity_header": "x-session-token",
            },
            environ={},
        )
        with serve(create_app(settings, registry=CollectorRegistry())) as proxy:
            conversation(proxy, 3)
            conversation(proxy, 2, **{"x-session-id": "agent-7"})
    keys = [seen["x-session-id"] for seen in router.seen]
    assert keys[0] == keys[1] == keys[2] and keys[0].startswith("f:")  # one fingerprint
    assert keys[3:] == ["h:agent-7", "h:agent-7"]  # the client's own id, as the key
    tokens = [seen.get("x-session-token") for seen in router.seen]
    # The first request of each session has none; later ones carry what the router gave.
    assert tokens == [None, "pod-1", "pod-1", None, "pod-4"]


def test_without_the_settings_no_routing_header_is_added() -> None:
    router = Router()
    with serve(router.app) as upstream:
        settings = config.load({"upstream": upstream}, environ={})
        with serve(create_app(settings, registry=CollectorRegistry())) as proxy:
            conversation(proxy, 2)
    assert all("x-session-id" not in seen and "x-session-token" not in seen for seen in router.seen)
