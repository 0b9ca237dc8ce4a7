"""The ASGI application: wiring only. ``create_app`` builds everything from its arguments."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import httpx
from fastapi import FastAPI
from prometheus_client import CollectorRegistry, start_http_server
from starlette.exceptions import HTTPException
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy import heap, tokens
from proxy.batching import RoundTrips
from proxy.bodies import INPUT, BodyCache
from proxy.call import Services
from proxy.chat import CHAT_ROUTE, ChatCall, ChatServices
from proxy.compaction import Compactor
from proxy.compaction.budget import Sizer
from proxy.config import Settings
from proxy.engines import Engines
from proxy.exchange import Recorder
from proxy.fanout import FanoutGate
from proxy.metrics import Metrics
from proxy.passthrough import PassthroughCall
from proxy.paths import PathPolicy
from proxy.responses.call import RESPONSES_ROUTE, ResponsesCall
from proxy.rewrite import Pipeline, Transform
from proxy.rewrite.canonical_tools import canonical_tools
from proxy.rewrite.detector import VolatileDetector
from proxy.rewrite.restore import restore_history
from proxy.rewrite.template_kwargs import pin_template_kwargs
from proxy.rewrite.tool_batching import tool_batching
from proxy.rewrite.volatile import move_volatile
from proxy.routes import Endpoint, Probes, http_error, internal_error_handler
from proxy.sessions import MemoryStore, SessionStore
from proxy.tracker import SessionTracker
from proxy.upstream import Upstream
from proxy.warmup import Warmer

PASSTHROUGH_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]


log = logging.getLogger("prefill_proxy")


class ProxyApp(FastAPI):
    """FastAPI, with the requests of the proxied routes (a POST to exactly their path)
    handed straight to their endpoints. Starlette's stack (error and exception middleware,
    FastAPI's request telemetry, routing by pattern, a wrapper around every message sent)
    cost about 21 us a request, a few percent of the proxy's CPU on a 64 KB agent step
    (tests/benchmarks/overhead.py); the endpoints answer their own errors
    (proxy.routes.Endpoint). Every other request, and a path written any other way, goes
    through the whole app as before."""

    def __init__(self, *, direct: dict[tuple[str, str], ASGIApp], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.direct = direct  # (method, path) -> endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            endpoint = self.direct.get((scope["method"], scope["path"]))
            if endpoint is not None:
                await endpoint(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def serve_metrics(settings: Settings, registry: CollectorRegistry) -> Any:
    """/metrics on its own port when ``metrics_port`` is set (prometheus_client's server, in
    a thread); the server, to shut down, or None."""
    if not settings.metrics_port:
        return None
    server, _thread = start_http_server(settings.metrics_port, settings.host, registry=registry)
    return server


def default_transforms(settings: Settings) -> list[Transform]:
    """The rewrite pipeline, in order. Restoration reads the client's own messages, so it
    runs before anything that changes them. Tool batching comes last: it appends to the
    system prompt as the other transforms left it (never restored: proxy.prefix)."""
    batching = tool_batching(
        parallel=settings.parallel_tool_calls, instruction=settings.batching_instruction
    )
    return [canonical_tools, pin_template_kwargs, restore_history, move_volatile, batching]


def _prober(upstream: Upstream) -> Callable[[str, str], Awaitable[tuple[int, bytes]]]:
    async def get(base: str, path: str) -> tuple[int, bytes]:
        return await upstream.call(path, timeout=2.0, base=base)

    return get


def session_store(settings: Settings, metrics: Metrics) -> SessionStore:
    if settings.session_store == "redis":
        from proxy.redis_store import RedisStore, describe

        log.info("session store: %s", describe(settings.redis_url))
        return RedisStore(
            settings.redis_url,
            metrics,
            ttl_s=settings.session_ttl,
            max_sessions=settings.session_max,
            max_bytes=settings.session_max_bytes,
            timeout=settings.session_store_timeout,
        )
    return MemoryStore(settings.session_max, settings.session_ttl)


def create_app(
    settings: Settings,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    registry: CollectorRegistry | None = None,
    transforms: Sequence[Transform] | None = None,
) -> FastAPI:
    """The proxy app. ``transport`` replaces the upstream connection (tests), ``registry``
    the metrics registry, ``transforms`` the rewrite pipeline."""
    registry = registry if registry is not None else CollectorRegistry()
    metrics = Metrics(registry, model_label_limit=settings.model_label_limit)
    recorder = Recorder(metrics)
    upstream = Upstream(settings, transport)
    pipeline = Pipeline(
        default_transforms(settings) if transforms is None else transforms,
        disabled=settings.disabled_rewrites,
    )
    detector = VolatileDetector(settings.volatile_patterns)
    engines = Engines(
        settings.upstreams,
        metrics,
        max_waiting=settings.engine_max_waiting,
        spread_load=settings.engine_spread_load,
        probe_interval=settings.engine_probe_interval,
        health_path=settings.ready_path,
        dns_refresh=settings.upstream_dns_refresh,
    )
    tracker = compactor = summarizer = warmer = None
    if settings.sessions:
        store = session_store(settings, metrics)
        tracker = SessionTracker(store, detector, metrics)
        warmer = Warmer(
            settings, upstream, metrics, in_flight=lambda: recorder.in_flight, post=tracker.post
        )
        tracker.on_open.append(warmer.client_back)
        if settings.compaction:
            if settings.summarizer_url:
                summarizer = Upstream(
                    dataclasses.replace(settings, upstream=settings.summarizer_url)
                )
            compactor = Compactor(
                settings,
                upstream,
                metrics,
                sizer=Sizer(tokens.Lazy()),
                summarizer=summarizer,
                mask=detector.key,
                warmer=warmer,
                post=tracker.post,
            )
        # Compaction first: when it decides the next event early it warms that prompt, and
        # the warm-up of the uncompacted one is then skipped (one per session).
        tracker.listeners = [
            listener
            for listener in (RoundTrips(metrics), compactor, warmer)
            if listener is not None
        ]
    fanout = (
        FanoutGate(settings.fanout_hold, settings.fanout_min_tokens, metrics)
        if settings.fanout_hold > 0
        else None
    )
    keys = tuple(key.encode("latin-1") for key in settings.api_keys)
    services = Services(settings, upstream, recorder, keys=keys, engines=engines)
    bodies = BodyCache(settings.body_cache_bytes)
    response_bodies = BodyCache(settings.body_cache_bytes, array=INPUT)
    metrics.body_cache_bytes.set_function(lambda: bodies.held + response_bodies.held)
    chat = ChatServices(
        settings,
        upstream,
        recorder,
        keys=keys,
        engines=engines,
        pipeline=pipeline,
        sessions=tracker,
        compactor=compactor,
        fanout=fanout,
        bodies=bodies,
        response_bodies=response_bodies,
    )
    probes = Probes(services)
    paths = PathPolicy(settings.passthrough_paths)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tokens.provision(settings.tiktoken_cache_dir)  # the encoding loads when first needed
        metrics_server = serve_metrics(settings, registry)
        # What start-up built lives as long as the process: out of the collector's sight,
        # a full collection walks the requests' objects alone (26 ms -> 3.5 ms per full
        # collection at c=64; tests/benchmarks/overhead.py's p99).
        gc.freeze()
        with contextlib.suppress(TimeoutError):  # else the name itself until the next try
            await engines.resolve()
        probing = asyncio.create_task(engines.run(_prober(upstream)))
        trimming = asyncio.create_task(heap.trim_every())
        # Each generation's series from the start: a rate over them reads 0, not nothing.
        pauses = [metrics.gc_pauses.labels(str(generation)) for generation in range(3)]
        with heap.pauses_observed(lambda generation, s: pauses[generation].observe(s)):
            yield
        probing.cancel()
        trimming.cancel()
        if metrics_server is not None:
            metrics_server.shutdown()
        if compactor is not None:
            compactor.close()
        if warmer is not None:
            await warmer.aclose()
        if summarizer is not None:
            await summarizer.aclose()
        if tracker is not None:
            await tracker.aclose()
        await upstream.aclose()

    # Plain ASGI endpoints for proxied routes: each call reads the body itself (size limit,
    # raw bytes) and writes its response, so FastAPI's machinery would only add cost.
    chat_endpoint = Endpoint(lambda down: ChatCall(chat, down), metrics)
    responses_endpoint = Endpoint(lambda down: ResponsesCall(chat, down), metrics)
    # No docs routes: /docs and /openapi.json must reach the upstream like any other path.
    app = ProxyApp(
        direct={("POST", CHAT_ROUTE): chat_endpoint, ("POST", RESPONSES_ROUTE): responses_endpoint},
        title="prefill-proxy",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        exception_handlers={
            HTTPException: http_error,
            Exception: internal_error_handler(metrics),
        },
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.router.routes.extend(
        [
            Route(CHAT_ROUTE, chat_endpoint, methods=["POST"]),
            Route(RESPONSES_ROUTE, responses_endpoint, methods=["POST"]),
            Route("/health", probes.health, methods=["GET"]),
            Route("/ready", probes.ready, methods=["GET"]),
            # On its own port (metrics_port), /metrics is not served here: a 404 below.
            *(
                []
                if settings.metrics_port
                else [Route("/metrics", probes.metrics, methods=["GET"])]
            ),
            Route(
                "/{path:path}",
                Endpoint(lambda down: PassthroughCall(services, down, paths), metrics),
                methods=PASSTHROUGH_METHODS,
            ),
        ]
    )
    return app
