"""The paged prefix cache: vLLM v1's KVCacheManager and BlockPool, without the tensors.

Semantics mirrored from vLLM 0.32 (``vllm/v1/core/kv_cache_manager.py``,
``block_pool.py``, ``kv_cache_utils.py``):

- KV memory is a pool of fixed-size blocks. Only *full* blocks are cached, each under a
  hash chained over its parent's hash and its own token ids, so equal content at a
  different position (or after a different prefix) never hits. A request's
  ``cache_salt`` enters the first block's hash, so salted requests share only with the
  same salt.
- A lookup returns the longest run of cached blocks from the start, capped at
  ``num_tokens - 1``: the last token is always recomputed (its logits are needed), so the
  best case is ``floor((n - 1) / B) * B`` cached tokens.
- A block is cached when the step that computes it is *scheduled* (``allocate``), so a
  request admitted later in the same step already hits it.
- Blocks held by a running sequence are referenced and never evicted. Freed blocks go to
  a free queue: cached ones at the back (LRU), uncached ones at the front (reused first);
  a sequence frees its blocks tail first, so its tail is evicted before its head.
  Allocation takes from the front of that queue, dropping the block's hash (eviction).
"""

from __future__ import annotations

import dataclasses
import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence

BlockHash = bytes
_ROOT: BlockHash = b"prefill-proxy-sim"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def hash_block(parent: BlockHash, tokens: Sequence[int]) -> BlockHash:
    return hashlib.blake2b(parent + array("q", tokens).tobytes(), digest_size=16).digest()


@dataclasses.dataclass(eq=False)
class Block:
    id: int
    ref_cnt: int = 0
    hash: BlockHash | None = None


class BlockPool:
    """The blocks, the hash -> block map, and the eviction order of unreferenced blocks."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.num_blocks = num_blocks
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Front = evicted first. Holds exactly the blocks with ref_cnt == 0.
        self._free: OrderedDict[int, Block] = OrderedDict((b.id, b) for b in self.blocks)
        # A hash can map to several blocks when two sequences computed the same content.
        self._cached: dict[BlockHash, dict[int, Block]] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    def usage(self) -> float:
        """vLLM's kv_cache_usage_perc: the share of blocks held by running sequences."""
        return 1.0 - self.num_free / self.num_blocks

    def cached(self, block_hash: BlockHash) -> Block | None:
        blocks = self._cached.get(block_hash)
        return next(iter(blocks.values())) if blocks else None

    def touch(self, blocks: Iterable[Block]) -> None:
        """Reference cache hits: they leave the free queue (no longer evictable)."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.id]
            block.ref_cnt += 1

    def allocate(self, count: int) -> list[Block]:
        if count > self.num_free:
            raise ValueError(f"cannot allocate {count} blocks, {self.num_free} free")
        taken = []
        for _ in range(count):
            _, block = self._free.popitem(last=False)
            self._evict(block)
            block.ref_cnt = 1
            taken.append(block)
        return taken

    def free(self, ordered: Iterable[Block]) -> None:
        """Release blocks given in eviction order (the first is evicted first)."""
        uncached = []
        for block in ordered:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.hash is None:
                    uncached.append(block)
                else:
                    self._free[block.id] = block
        for block in reversed(uncached):  # prepend, keeping their order
            self._free[block.id] = block
            self._free.move_to_end(block.id, last=False)

    def cache(self, block: Block, block_hash: BlockHash) -> None:
        block.hash = block_hash
        self._cached.setdefault(block_hash, {})[block.id] = block

    def _evict(self, block: Block) -> None:
        if block.hash is None:
            return
        entries = self._cached.get(block.hash, {})
        entries.pop(block.id, None)
        if not entries:
            self._cached.pop(block.hash, None)
        block.hash = None

    def reset(self) -> bool:
        """Forget every cached hash; refused (False) while any block is referenced."""
        if self.num_free != self.num_blocks:
            return False
        self._cached.clear()
        for block in self.blocks:
            block.hash = None
        return True


class SequenceKV:
    """One sequence's tokens (prompt + output so far), block hashes and blocks."""

    def __init__(self, tokens: Sequence[int], block_size: int, salt: str = "") -> None:
        self.tokens = list(tokens)
        self.block_size = block_size
        self._root = hash_block(_ROOT + salt.encode(), ()) if salt else _ROOT
        self.hashes: list[BlockHash] = []
        self.blocks: list[Block] = []
        self.num_cached_blocks = 0  # leading blocks already in the cache map

    def full_block_hashes(self) -> list[BlockHash]:
        """Hashes of every full block of the tokens, extended as tokens are appended."""
        size = self.block_size
        for index in range(len(self.hashes), len(self.tokens) // size):
            parent = self.hashes[-1] if self.hashes else self._root
            self.hashes.append(hash_block(parent, self.tokens[index * size : (index + 1) * size]))
        return self.hashes


class KVCacheManager:
    """Per-sequence allocation on a BlockPool, with prefix-cache lookups."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)

    def lookup(self, seq: SequenceKV) -> list[Block]:
        """The cached blocks of the longest hit, never covering the last token."""
        limit = (len(seq.tokens) - 1) // self.block_size
        hits = []
        for block_hash in seq.full_block_hashes()[:limit]:
            block = self.pool.cached(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def blocks_needed(self, seq: SequenceKV, num_tokens: int, hits: Sequence[Block]) -> int:
        """Free blocks an allocation for ``num_tokens`` slots would consume."""
        new = cdiv(num_tokens, self.block_size) - len(seq.blocks) - len(hits)
        evictable_hits = sum(1 for block in hits if block.ref_cnt == 0)
        return max(new, 0) + evictable_hits

    def allocate(
        self,
        seq: SequenceKV,
        num_computed: int,
        num_new: int,
        hits: Sequence[Block] = (),
        reserve_tokens: int = 0,
    ) -> bool:
        """Give ``seq`` slots for ``num_new`` more tokens after ``num_computed`` (plus the
        hits) and cache every block that becomes full. ``reserve_tokens`` demands room for
        that many slots (vLLM admits a request only if its whole prompt fits). False, and
        nothing changed, if the pool is short."""
        computed = num_computed + len(hits) * self.block_size
        slots = computed + num_new
        if self.blocks_needed(seq, max(slots, reserve_tokens), hits) > self.pool.num_free:
            return False
        if hits:
            self.pool.touch(hits)
            seq.blocks.extend(hits)
            seq.num_cached_blocks = len(seq.blocks)
        missing = cdiv(slots, self.block_size) - len(seq.blocks)
        if missing > 0:
            seq.blocks.extend(self.pool.allocate(missing))
        self._cache_full_blocks(seq, min(slots, len(seq.tokens)))
        return True

    def _cache_full_blocks(self, seq: SequenceKV, num_tokens: int) -> None:
        full = num_tokens // self.block_size
        hashes = seq.full_block_hashes()
        for index in range(seq.num_cached_blocks, full):
            self.pool.cache(seq.blocks[index], hashes[index])
        seq.num_cached_blocks = max(seq.num_cached_blocks, full)

    def free(self, seq: SequenceKV) -> None:
        self.pool.free(reversed(seq.blocks))
        seq.blocks = []
        seq.num_cached_blocks = 0

    def reset(self) -> bool:
        return self.pool.reset()
