"""The simulator's ASGI app: wiring only. ``create_sim_app`` builds everything."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from proxy.sim.cache import KVCacheManager
from proxy.sim.clock import Clock, MonotonicClock
from proxy.sim.config import SimConfig
from proxy.sim.engine import Engine
from proxy.sim.metrics import SimMetrics
from proxy.sim.prompt import PromptBuilder
from proxy.sim.routes import SimRoutes
from proxy.sim.scheduler import Scheduler
from proxy.sim.template import ChatRenderer, template_source
from proxy.sim.tokenizer import load_tokenizer


def create_sim_app(
    config: SimConfig,
    clock: Clock | None = None,
    *,
    registry: CollectorRegistry | None = None,
) -> FastAPI:
    """The simulator app. ``clock`` drives the engine (tests pass a manual one);
    ``registry`` receives the vLLM-named metrics. Loads the tokenizer and template now
    (raises TokenizerError if they cannot be read)."""
    registry = registry if registry is not None else CollectorRegistry()
    tokenizer = load_tokenizer(config.tokenizer)
    renderer = ChatRenderer(template_source(config.tokenizer), tokenizer.template_vars)
    kv = KVCacheManager(config.num_blocks, config.block_size)
    metrics = SimMetrics(
        registry,
        config.model_name,
        max_model_len=config.max_model_len,
        block_size=config.block_size,
        num_blocks=config.num_blocks,
    )
    engine = Engine(
        Scheduler(kv, config.max_num_batched_tokens, config.max_num_seqs),
        config.cost,
        clock if clock is not None else MonotonicClock(),
        speed=config.speed,
        metrics=metrics,
    )
    routes = SimRoutes(config, PromptBuilder(renderer, tokenizer), engine, registry)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        yield
        await engine.aclose()

    app = FastAPI(
        title="prefill-proxy sim",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.engine = engine
    app.state.config = config
    app.add_route("/v1/chat/completions", routes.chat_completions, methods=["POST"])
    app.add_route("/v1/responses", routes.responses, methods=["POST"])
    app.add_route("/v1/completions", routes.completions, methods=["POST"])
    app.add_route("/v1/models", routes.models, methods=["GET"])
    app.add_route("/tokenize", routes.tokenize, methods=["POST"])
    app.add_route("/detokenize", routes.detokenize, methods=["POST"])
    app.add_route("/health", routes.health, methods=["GET"])
    app.add_route("/metrics", routes.metrics, methods=["GET"])
    app.add_route("/reset_prefix_cache", routes.reset_prefix_cache, methods=["POST"])
    return app
