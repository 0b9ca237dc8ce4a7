"""The bar the proxy's overhead is measured against: a bare FastAPI app that forwards a chat
completion's bytes to the upstream with aiohttp and relays the answer (streamed or not),
nothing parsed, nothing rewritten. Same server stack as the proxy (uvicorn, uvloop,
httptools), and the same glibc thresholds (proxy.heap.reuse_freed_pages): without them a
relay of 1 MB bodies may fault every buffer's pages in again on each request, or not, by
chance (1.6 or 4.6 ms of CPU a request in two runs), and the bar would move with it. A
benchmark's reference point, not a product.

    python -m tests.benchmarks.passthrough PORT UPSTREAM_URL
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator

import aiohttp
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from proxy import heap

HOP_BY_HOP = {"connection", "content-length", "transfer-encoding", "keep-alive"}


def create(upstream: str) -> FastAPI:
    client: dict[str, aiohttp.ClientSession] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(upstream, connector=connector) as session:
            client["session"] = session
            yield

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.body()
        headers = {"content-type": "application/json"}
        answer = await client["session"].post("/v1/chat/completions", data=body, headers=headers)
        kept = {k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP}
        if answer.headers.get("content-type", "").startswith("text/event-stream"):

            async def relay() -> AsyncIterator[bytes]:
                async with answer:
                    async for chunk in answer.content.iter_any():
                        yield chunk

            return StreamingResponse(relay(), status_code=answer.status, headers=kept)
        async with answer:
            content = await answer.read()
        return Response(content, status_code=answer.status, headers=kept)

    return app


def main() -> None:
    port, upstream = int(sys.argv[1]), sys.argv[2]
    heap.reuse_freed_pages()
    uvicorn.run(
        create(upstream),
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        log_level="warning",
        access_log=False,
        # As the proxy's: uvicorn's 5 s default closed connections the benchmark client
        # kept idle through other targets' rounds, racing its next request on them.
        timeout_keep_alive=65,
    )


if __name__ == "__main__":
    main()
