"""The simulator's scheduler, cost model and engine loop, on a manual clock (no sleeping)."""

from __future__ import annotations

import asyncio

import pytest

from proxy.sim.cache import KVCacheManager
from proxy.sim.clock import ManualClock
from proxy.sim.engine import Engine, Handle
from proxy.sim.scheduler import Scheduler
from proxy.sim.scheduler import Sequence as SimSequence
from proxy.sim.timing import CostModel, Work

B = 16
COST = CostModel()


def scheduler(num_blocks: int = 1000, budget: int = 8192, seqs: int = 64) -> Scheduler:
    return Scheduler(KVCacheManager(num_blocks, B), budget, seqs)


def seq(name: str, prompt_len: int, outputs: int = 4, start: int = 0) -> SimSequence:
    return SimSequence(name, list(range(start, start + prompt_len)), list(range(outputs)), B)


# --- cost model ------------------------------------------------------------------------


def test_prefill_is_compute_bound_and_grows_with_context() -> None:
    cold = COST.step_seconds([Work(tokens=2048, context=0)])
    late = COST.step_seconds([Work(tokens=2048, context=30_000)])
    assert cold == pytest.approx(
        COST.step_overhead_s + 2048 * COST.prefill_token_s + 2048 * 2049 / 2 * COST.attention_pair_s
    )
    assert 0.05 < cold < 0.15  # ~20k tokens/s on the modelled H100
    assert late > cold * 1.5  # the same chunk costs more after a long context


def test_decode_is_memory_bound_and_shared_by_the_batch() -> None:
    one = COST.step_seconds([Work(tokens=1, context=1000)])
    assert one == pytest.approx(
        COST.step_overhead_s + COST.weights_read_s + 1001 * COST.kv_read_token_s
    )
    assert 0.006 < one < 0.008
    batch = COST.step_seconds([Work(tokens=1, context=1000)] * 32)
    assert batch < 2 * one  # the weights are read once per step, not per sequence
    long = COST.step_seconds([Work(tokens=1, context=32_000)])
    assert long > one + 0.001  # KV reads grow with context
    # Its arithmetic is a small part of it: the rest is room for prefill at no cost.
    duration, compute = COST.step_cost([Work(tokens=1, context=1000)])
    assert duration == one and compute < one / 20
    prefill, compute = COST.step_cost([Work(tokens=4096, context=0)])
    assert compute == pytest.approx(prefill - COST.step_overhead_s)  # bound by arithmetic


def test_an_empty_step_costs_nothing_and_costs_must_not_be_negative() -> None:
    assert COST.step_seconds([]) == 0.0
    with pytest.raises(ValueError):
        CostModel(prefill_token_s=-1)


# --- scheduler -------------------------------------------------------------------------


def test_a_long_prompt_is_prefilled_in_chunks_of_the_budget() -> None:
    sched = scheduler(budget=1000)
    long = seq("long", 2500)
    sched.add(long)
    chunks = []
    while long.num_sampled == 0:
        step = sched.schedule()
        chunks.append([(item.tokens, item.context) for item in step.scheduled])
        sched.complete(step)
    assert chunks == [[(1000, 0)], [(1000, 1000)], [(500, 2000)]]


def test_decodes_and_a_prefill_chunk_share_one_step() -> None:
    sched = scheduler(budget=100)
    talker = seq("talker", 40, outputs=10)
    sched.add(talker)
    sched.complete(sched.schedule())  # prefill: talker is now decoding
    sched.add(seq("reader", 500, start=10_000))
    step = sched.schedule()
    assert [(i.seq.request_id, i.tokens) for i in step.scheduled] == [
        ("talker", 1),
        ("reader", 99),
    ]


def test_admission_is_first_come_first_served_and_bounded() -> None:
    sched = scheduler(seqs=2)
    for name in "abc":
        sched.add(seq(name, 20, start=ord(name) * 100))
    step = sched.schedule()
    assert [i.seq.request_id for i in step.scheduled] == ["a", "b"]
    assert [s.request_id for s in sched.waiting] == ["c"]


def test_a_request_admitted_with_an_identical_one_hits_the_blocks_it_computes() -> None:
    """vLLM caches a block when its step is scheduled, so a request admitted later in
    the same step already reuses it (the KV is written before attention reads it)."""
    sched = scheduler()
    twin_a, twin_b = seq("a", 100), seq("b", 100)
    sched.add(twin_a)
    sched.add(twin_b)
    step = sched.schedule()
    assert [(i.seq.request_id, i.tokens) for i in step.scheduled] == [("a", 100), ("b", 4)]
    assert (twin_a.cached_tokens, twin_b.cached_tokens) == (0, 96)


def test_a_request_that_does_not_fit_waits_and_blocks_the_queue() -> None:
    sched = scheduler(num_blocks=10)  # 160 tokens
    sched.add(seq("big", 100, outputs=40))  # 7 blocks now, 9 at the end
    sched.add(seq("wide", 60, start=5000))  # 4 blocks: does not fit beside it
    sched.add(seq("small", 10, start=9000))  # would fit, but may not skip ahead
    step = sched.schedule()
    assert [i.seq.request_id for i in step.scheduled] == ["big"]
    assert len(sched.waiting) == 2


def test_the_newest_running_sequence_is_preempted_and_recomputed_from_cache() -> None:
    sched = scheduler(num_blocks=8)  # 128 tokens
    first = seq("first", 40, outputs=60)
    second = seq("second", 40, outputs=60, start=5000)
    sched.add(first)
    sched.add(second)
    preempted = []
    for _ in range(500):
        if not sched.has_work():
            break
        step = sched.schedule()
        preempted += [s.request_id for s in step.preempted]
        sched.complete(step)
    assert preempted and set(preempted) == {"second"}
    assert first.finished and second.finished
    assert second.num_sampled == 60 and second.cached_tokens == 0  # from its first admission


def test_abort_frees_the_blocks_and_the_step_result_is_dropped() -> None:
    sched = scheduler()
    victim = seq("victim", 50)
    sched.add(victim)
    step = sched.schedule()
    sched.abort(victim)
    assert sched.kv.pool.num_free == 1000
    assert sched.complete(step) == []
    assert not sched.has_work()


# --- engine loop -----------------------------------------------------------------------


async def collect(handle: Handle) -> list[int]:
    return [index async for index in handle.tokens()]


def engine(clock: ManualClock, speed: float = 1.0, **kwargs: int) -> Engine:
    return Engine(scheduler(**kwargs), COST, clock, speed=speed)


@pytest.mark.anyio
async def test_ttft_and_decode_follow_the_cost_model() -> None:
    clock = ManualClock()
    eng = engine(clock)
    prompt = list(range(3000))
    handle = eng.submit("r1", prompt, [1, 2, 3])
    assert await collect(handle) == [0, 1, 2]
    prefill = COST.step_seconds([Work(3000, 0)])
    assert handle.first_token_at == pytest.approx(prefill)
    decode = COST.step_seconds([Work(1, 3000)]) + COST.step_seconds([Work(1, 3001)])
    assert handle.finished_at == pytest.approx(prefill + decode)
    assert (handle.prompt_tokens, handle.cached_tokens, handle.completion_tokens) == (3000, 0, 3)
    assert handle.created_cache_tokens == 3000 // B * B
    again = eng.submit("r2", prompt, [1])
    await collect(again)
    assert again.cached_tokens == 2992
    cached_ttft = again.first_token_at - again.arrival
    assert cached_ttft == pytest.approx(COST.step_seconds([Work(8, 2992)]))
    assert cached_ttft < prefill / 10
    await eng.aclose()


@pytest.mark.anyio
async def test_speed_divides_time() -> None:
    clock = ManualClock()
    eng = engine(clock, speed=100)
    handle = eng.submit("r", list(range(3000)), [1])
    await collect(handle)
    assert handle.first_token_at == pytest.approx(COST.step_seconds([Work(3000, 0)]) / 100)
    await eng.aclose()


@pytest.mark.anyio
async def test_concurrent_requests_share_the_engine() -> None:
    """Two 6000-token prompts with an 8192-token budget: the second's prefill is split
    over the two steps, so its first token comes a step later than alone."""
    clock = ManualClock()
    eng = engine(clock)
    one = eng.submit("one", list(range(6000)), [1, 2])
    two = eng.submit("two", list(range(100_000, 106_000)), [1, 2])
    await asyncio.gather(collect(one), collect(two))
    first = COST.step_seconds([Work(6000, 0), Work(2192, 0)])
    assert one.first_token_at == pytest.approx(first)
    second = COST.step_seconds([Work(1, 6000), Work(3808, 2192)])
    assert two.first_token_at == pytest.approx(first + second)
    assert two.first_token_at > COST.step_seconds([Work(6000, 0)]) * 1.5
    await eng.aclose()


@pytest.mark.anyio
async def test_an_aborted_request_frees_its_blocks_and_the_engine_goes_on() -> None:
    clock = ManualClock()
    eng = engine(clock)
    gone = eng.submit("gone", list(range(500)), list(range(1000)))
    stays = eng.submit("stays", list(range(9000, 9100)), [1, 2])
    tokens = gone.tokens()
    await anext(tokens)
    eng.abort(gone)
    await tokens.aclose()
    assert await collect(stays) == [0, 1]
    assert eng.scheduler.kv.pool.num_free == 1000
    assert eng.reset_prefix_cache()
    await eng.aclose()
