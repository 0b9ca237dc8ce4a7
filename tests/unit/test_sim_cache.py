"""The simulator's prefix cache: vLLM v1's block semantics, checked without an engine."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.sim.cache import BlockPool, KVCacheManager, SequenceKV
from proxy.sim.scheduler import Scheduler
from proxy.sim.scheduler import Sequence as SimSequence

B = 16


def run_to_completion(kv: KVCacheManager, prompt: Sequence[int], outputs: Sequence[int]) -> int:
    """Prefill ``prompt`` and decode ``outputs`` as the scheduler does; the cached tokens."""
    scheduler = Scheduler(kv, max_batched_tokens=100_000, max_seqs=8)
    seq = SimSequence("r", prompt, outputs, kv.block_size)
    scheduler.add(seq)
    while not seq.finished:
        scheduler.complete(scheduler.schedule())
    assert seq.cached_tokens is not None
    return seq.cached_tokens


def cached_for(kv: KVCacheManager, tokens: Sequence[int]) -> int:
    return len(kv.lookup(SequenceKV(tokens, kv.block_size))) * kv.block_size


def tokens(start: int, count: int) -> list[int]:
    return list(range(start, start + count))


def test_a_repeated_prompt_hits_every_full_block_but_the_last_token() -> None:
    kv = KVCacheManager(num_blocks=64, block_size=B)
    prompt = tokens(0, 100)
    assert run_to_completion(kv, prompt, [1]) == 0
    assert run_to_completion(kv, prompt, [1]) == (100 - 1) // B * B == 96


@pytest.mark.parametrize(("length", "expected"), [(16, 0), (17, 16), (32, 16), (33, 32), (47, 32)])
def test_hits_are_block_aligned_and_keep_the_last_token_to_recompute(length, expected) -> None:
    kv = KVCacheManager(num_blocks=64, block_size=B)
    run_to_completion(kv, tokens(0, 64), [1])
    assert cached_for(kv, tokens(0, length)) == expected


def test_a_block_hits_only_after_the_same_prefix() -> None:
    kv = KVCacheManager(num_blocks=64, block_size=B)
    first, second = tokens(0, B), tokens(1000, B)
    run_to_completion(kv, first + second + [7], [1])
    assert cached_for(kv, second + first + [7]) == 0  # same blocks, other positions
    assert cached_for(kv, tokens(5000, B) + second + [7]) == 0  # same block, other parent
    assert cached_for(kv, first + tokens(2000, B) + [7]) == B  # diverges in block two


def test_a_cache_salt_shares_blocks_only_with_the_same_salt() -> None:
    kv = KVCacheManager(num_blocks=64, block_size=B)
    prompt = tokens(0, 40)
    scheduler = Scheduler(kv, max_batched_tokens=1000, max_seqs=8)
    for name, salt in (("plain", ""), ("tenant-a", "a"), ("tenant-b", "b"), ("again-a", "a")):
        seq = SimSequence(name, prompt, [1], B, salt=salt)
        scheduler.add(seq)
        scheduler.complete(scheduler.schedule())
        assert seq.cached_tokens == (32 if name == "again-a" else 0), name


def test_decode_blocks_are_cached_except_the_last_sampled_token() -> None:
    kv = KVCacheManager(num_blocks=64, block_size=B)
    prompt, outputs = tokens(0, 20), tokens(500, 29)  # 49 tokens, the last never computed
    run_to_completion(kv, prompt, outputs)
    history = prompt + outputs
    assert cached_for(kv, [*history[:48], 9]) == 48  # three blocks, two of them decoded
    assert cached_for(kv, history + tokens(900, 20)) == 48  # block 4 holds the last token
    kv2 = KVCacheManager(num_blocks=64, block_size=B)
    run_to_completion(kv2, prompt, tokens(500, 28))  # ends one token earlier
    assert cached_for(kv2, history + tokens(900, 20)) == 32


def test_blocks_of_a_running_sequence_are_never_evicted() -> None:
    kv = KVCacheManager(num_blocks=6, block_size=B)
    run_to_completion(kv, tokens(0, 3 * B + 1), [1])  # leaves 3 cached, unreferenced blocks
    running = SequenceKV(tokens(100, 2 * B), B)
    assert kv.allocate(running, 0, 2 * B)  # holds 2 blocks (takes 2 never-used blocks)
    assert kv.pool.num_free == 4  # 1 never-used + 3 cached evictable
    newcomer = SequenceKV(tokens(200, 4 * B), B)
    assert kv.allocate(newcomer, 0, 4 * B)  # needs 4: the free one, then evicts 3 cached
    assert cached_for(kv, tokens(0, 3 * B + 1)) == 0
    assert cached_for(kv, [*tokens(100, 2 * B), 1]) == 2 * B  # the running one kept its blocks
    assert not kv.allocate(SequenceKV(tokens(300, B), B), 0, B)  # nothing left to evict


@pytest.mark.parametrize(("evicted", "left_in_b"), [(1, B), (2, 0)])
def test_eviction_takes_the_least_recently_used_blocks_tail_first(evicted, left_in_b) -> None:
    kv = KVCacheManager(num_blocks=12, block_size=B)
    a, b = tokens(0, 2 * B + 1), tokens(1000, 2 * B + 1)
    run_to_completion(kv, a, [1])
    run_to_completion(kv, b, [1])
    assert run_to_completion(kv, a, [1]) == 2 * B  # a is now more recent than b
    uncached_free = kv.pool.num_free - 4
    taker = SequenceKV(tokens(5000, (uncached_free + evicted) * B), B)
    assert kv.allocate(taker, 0, (uncached_free + evicted) * B)
    assert cached_for(kv, b) == left_in_b  # b's tail block went first
    assert cached_for(kv, a) == 2 * B


def test_capacity_refuses_what_does_not_fit_and_changes_nothing() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=B)
    seq = SequenceKV(tokens(0, 5 * B), B)
    assert not kv.allocate(seq, 0, 5 * B)
    assert seq.blocks == [] and kv.pool.num_free == 4
    assert kv.allocate(seq, 0, 4 * B)
    assert kv.pool.usage() == 1.0


def test_reset_is_refused_while_blocks_are_held() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=B)
    run_to_completion(kv, tokens(0, 3 * B), [1])
    held = SequenceKV(tokens(500, B), B)
    kv.allocate(held, 0, B)
    assert not kv.reset()
    assert cached_for(kv, tokens(0, 3 * B)) == 2 * B
    kv.free(held)
    assert kv.reset()
    assert cached_for(kv, tokens(0, 3 * B)) == 0


def test_pool_rejects_an_empty_cache() -> None:
    with pytest.raises(ValueError):
        BlockPool(0)


# --- properties ------------------------------------------------------------------------

conversations = st.lists(
    st.tuples(
        st.lists(st.integers(0, 3), min_size=1, max_size=70),  # prompt over a tiny alphabet
        st.lists(st.integers(0, 3), min_size=1, max_size=20),  # outputs
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(conversations, st.sampled_from([2, 4, 16]))
def test_hits_equal_the_longest_cached_block_prefix(runs, block_size) -> None:
    """Reference model: every full block of prompt + output[:-1] of every earlier request
    is cached (no eviction), and a hit is the longest such prefix, capped at n - 1."""
    kv = KVCacheManager(num_blocks=10_000, block_size=block_size)
    cached_prefixes: set[tuple[int, ...]] = set()
    for prompt, outputs in runs:
        limit = (len(prompt) - 1) // block_size
        expected = 0
        for count in range(1, limit + 1):
            if tuple(prompt[: count * block_size]) not in cached_prefixes:
                break
            expected = count * block_size
        assert run_to_completion(kv, prompt, outputs) == expected
        computed = prompt + outputs[:-1]
        for count in range(1, len(computed) // block_size + 1):
            cached_prefixes.add(tuple(computed[: count * block_size]))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=60), min_size=1, max_size=12),
    st.integers(4, 12),
)
def test_a_small_pool_keeps_its_books(prompts, num_blocks) -> None:
    """Under eviction pressure (several sequences at once, preemption): referenced blocks
    are never in the free queue, cached hashes resolve to blocks that carry them, and
    every block is either free or referenced."""
    kv = KVCacheManager(num_blocks=num_blocks, block_size=4)
    scheduler = Scheduler(kv, max_batched_tokens=8, max_seqs=3)
    seqs = []
    for index, prompt in enumerate(prompts):
        if len(prompt) + 3 > num_blocks * 4:
            continue
        seq = SimSequence(str(index), prompt, [index % 3, 1, 2], 4)
        seqs.append(seq)
        scheduler.add(seq)
    for _ in range(10_000):
        if not scheduler.has_work():
            break
        scheduler.complete(scheduler.schedule())
        pool = kv.pool
        held = {b.id for s in scheduler.running for b in s.kv.blocks}
        assert all(pool.blocks[i].ref_cnt > 0 for i in held)
        assert pool.num_free == sum(1 for b in pool.blocks if b.ref_cnt == 0)
        for block in pool.blocks:
            if block.hash is not None:
                assert pool.cached(block.hash) is not None
    assert all(seq.finished for seq in seqs)
    assert kv.pool.num_free == num_blocks
