"""How long one engine step takes: a roofline cost model with GPU-like defaults.

A step runs one forward pass over every scheduled token (prefill chunks and one token per
decoding sequence). It is bound either by compute or by memory traffic, whichever is
larger, plus a fixed per-step overhead (scheduling, sampling, kernel launches):

    compute = tokens * prefill_token_s + attention_pairs * attention_pair_s
    memory  = weights_read_s + kv_tokens_read * kv_read_token_s
    step    = step_overhead_s + max(compute, memory)

where ``attention_pairs`` counts (query token, context token) pairs of the causal
attention (a prefill chunk of n tokens after c cached ones has n*c + n*(n+1)/2) and
``kv_tokens_read`` is the context every scheduled sequence reads. So a long uncached
prompt is compute-bound and grows with context (attention); a decode step is
memory-bound: it reads the weights once for the whole batch plus each sequence's KV.

Defaults: **Llama-3.1-8B-Instruct, bf16, on one NVIDIA H100 SXM 80GB, under vLLM**:

- Model (its ``config.json``): 8.03e9 parameters, 32 layers, hidden 4096, 32 query heads,
  8 KV heads of dimension 128. Weights: 16.1 GB. KV per token: 2 (K, V) x 32 layers x 8
  heads x 128 x 2 bytes = 128 KiB.
- GPU (NVIDIA H100 SXM datasheet): 989 TFLOPS dense bf16, 3.35 TB/s HBM3.
- ``prefill_token_s`` = 2 x 8.03e9 FLOP / (989e12 x 36% utilisation) = 4.5e-5 s: about
  22k tokens/s for short prompts, falling to ~15k tokens/s at 32k context once attention
  counts. Measured vLLM prefill on this pair is of that order (10-25k tokens/s).
- ``attention_pair_s`` = 4 x 32 layers x 4096 FLOP / (989e12 x 40%) = 1.3e-9 s.
- ``weights_read_s`` = 16.1 GB / (3.35 TB/s x 80%) = 6.0e-3 s, and
  ``kv_read_token_s`` = 128 KiB / (3.35 TB/s x 80%) = 4.9e-8 s: a decode step at small
  batch and short context takes ~6.5 ms (~150 tokens/s per stream), +1.6 ms at 32k
  context, as published single-stream figures for 8B bf16 on an H100 show (6-8 ms).
- ``step_overhead_s`` = 0.5 ms of CPU-side work per step (vLLM v1 overlaps most of it).

Scheduler limits and KV capacity, same sources: vLLM's defaults for a >=70 GiB GPU
(``engine/arg_utils.py``) are 8192 batched tokens and 1024 sequences per step; KV space is
80 GB x 0.9 (gpu_memory_utilization) - 16.1 GB weights - ~2 GB activations ~= 54 GB,
i.e. ~400k tokens at 128 KiB each. All of these are flags of ``prefill-proxy sim``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable


@dataclasses.dataclass(frozen=True)
class Work:
    """One sequence's share of a step: ``tokens`` new tokens after ``context`` computed."""

    tokens: int
    context: int


@dataclasses.dataclass(frozen=True)
class CostModel:
    prefill_token_s: float = 4.5e-5
    attention_pair_s: float = 1.3e-9
    weights_read_s: float = 6.0e-3
    kv_read_token_s: float = 4.9e-8
    step_overhead_s: float = 5.0e-4

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if getattr(self, field.name) < 0:
                raise ValueError(f"{field.name} must not be negative")

    def step_seconds(self, batch: Iterable[Work]) -> float:
        """Modelled duration of one forward pass over ``batch`` (0 for an empty batch)."""
        return self.step_cost(batch)[0]

    def step_cost(self, batch: Iterable[Work]) -> tuple[float, float]:
        """(duration, compute) of one forward pass: compute is the part the arithmetic
        takes, so duration minus compute is what a step bound by memory traffic leaves
        for more tokens at no cost (a decode step leaves most of it)."""
        tokens = pairs = kv_read = 0
        for work in batch:
            tokens += work.tokens
            pairs += work.tokens * work.context + work.tokens * (work.tokens + 1) // 2
            kv_read += work.context + work.tokens
        if tokens == 0:
            return 0.0, 0.0
        compute = tokens * self.prefill_token_s + pairs * self.attention_pair_s
        memory = self.weights_read_s + kv_read * self.kv_read_token_s
        return self.step_overhead_s + max(compute, memory), compute
