"""The simulator's settings: one frozen object, built by the command line or by tests."""

from __future__ import annotations

import dataclasses

from proxy.sim.timing import CostModel

# Llama-3.1-8B's context; the command caps it to the KV capacity when not given.
DEFAULT_MAX_MODEL_LEN = 131_072


@dataclasses.dataclass(frozen=True)
class SimConfig:
    model_name: str = "sim-model"
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    block_size: int = 16
    capacity_tokens: int = 400_000  # ~54 GB of KV at 128 KiB/token: see proxy.sim.timing
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 1024
    speed: float = 1.0
    tokenizer: str | None = None  # a model folder (tokenizer.json + chat template)
    reply_tokens: int = 16  # length of a synthetic answer, end-of-turn token included
    cost: CostModel = dataclasses.field(default_factory=CostModel)
    fingerprint: str = "prefill-proxy-sim"

    def __post_init__(self) -> None:
        positive = ("max_model_len", "block_size", "capacity_tokens", "max_num_batched_tokens")
        for name in (*positive, "max_num_seqs", "reply_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.speed <= 0:
            raise ValueError("speed must be positive")
        # vLLM refuses to start when one max-length sequence cannot fit in the KV cache.
        if self.num_blocks * self.block_size < self.max_model_len:
            raise ValueError(
                f"the KV cache ({self.num_blocks * self.block_size} tokens) cannot hold one "
                f"sequence of max_model_len={self.max_model_len}; lower max_model_len or "
                "raise the capacity"
            )

    @property
    def num_blocks(self) -> int:
        return self.capacity_tokens // self.block_size
