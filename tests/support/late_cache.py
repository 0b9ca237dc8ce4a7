"""The simulator with an engine that shares a prompt block only once a step has computed
it, as vLLM V0 and engines that reuse KV only after a request's prefill do.

vLLM V1, and the simulator by default, cache a block when the step that computes it is
scheduled, so requests admitted in that same step already share it: concurrent requests
with one new prefix compute it once with or without the proxy's fan-out holds. With this
engine they compute it once each unless they are held (vLLM issue #9643 describes the V0
behaviour). The simulator has no switch for this (yet): the engine's cache manager is
replaced after the app is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from proxy.sim.app import create_sim_app
from proxy.sim.cache import Block, KVCacheManager, SequenceKV
from proxy.sim.config import SimConfig


class ComputedOnlyKV(KVCacheManager):
    """Caches only blocks computed by earlier steps: a sequence's new blocks become hits
    when it is scheduled again (its next chunk or first decode step)."""

    _limit = 0

    def allocate(
        self,
        seq: SequenceKV,
        num_computed: int,
        num_new: int,
        hits: Sequence[Block] = (),
        reserve_tokens: int = 0,
    ) -> bool:
        self._limit = num_computed + len(hits) * self.block_size
        return super().allocate(seq, num_computed, num_new, hits, reserve_tokens)

    def _cache_full_blocks(self, seq: SequenceKV, num_tokens: int) -> None:
        super()._cache_full_blocks(seq, min(num_tokens, self._limit))


def late_cache_sim_app(config: SimConfig, registry: CollectorRegistry | None = None) -> FastAPI:
    app = create_sim_app(config, registry=registry)
    engine: Any = app.state.engine
    engine.scheduler.kv = ComputedOnlyKV(config.num_blocks, config.block_size)
    return app
