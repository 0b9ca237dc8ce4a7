"""Continuous batching as vLLM v1's scheduler does it, without time: pure and synchronous.

Each step has a token budget (``max_num_batched_tokens``). Running sequences go first, in
arrival order: a decoding one takes one token, a prefilling one the rest of its prompt
up to the budget (chunked prefill). If the KV pool cannot hold a running sequence's next
tokens, the most recently admitted sequence is preempted: its blocks are freed and it
waits again at the head of the queue, to be recomputed (mostly from the cache) later.
Waiting sequences are admitted in order only in a step that preempted nothing, while the
budget lasts, if ``max_num_seqs`` allows and their whole sequence fits the pool; the
first one that does not fit stops admission (no skipping ahead).

A sequence's output is planned in advance (the simulator knows what it will answer):
when a step completes all its known tokens, the next planned token is "sampled" and
appended, and the sequence finishes when the plan is exhausted. Its last token is never
fed back, so it is never cached (as in vLLM).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Sequence as Seq

from proxy.sim.cache import KVCacheManager, SequenceKV
from proxy.sim.timing import Work


@dataclasses.dataclass(eq=False)
class Sequence:
    request_id: str
    prompt: Seq[int]
    outputs: Seq[int]  # the planned output tokens, at least one
    block_size: int
    salt: str = ""  # the request's cache_salt
    kv: SequenceKV = dataclasses.field(init=False)
    num_computed: int = 0
    num_sampled: int = 0
    cached_tokens: int | None = None  # prompt tokens found in the cache at admission
    num_preemptions: int = 0
    finished: bool = False

    def __post_init__(self) -> None:
        if not self.outputs:
            raise ValueError("a sequence must produce at least one token")
        self.kv = SequenceKV(self.prompt, self.block_size, self.salt)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def num_tokens(self) -> int:
        return len(self.kv.tokens)


@dataclasses.dataclass(frozen=True)
class Scheduled:
    seq: Sequence
    tokens: int  # new tokens computed in this step
    context: int  # tokens already computed before them
    first_admission: bool = False

    def work(self) -> Work:
        return Work(self.tokens, self.context)


@dataclasses.dataclass
class Step:
    scheduled: list[Scheduled] = dataclasses.field(default_factory=list)
    preempted: list[Sequence] = dataclasses.field(default_factory=list)

    def work(self) -> list[Work]:
        return [item.work() for item in self.scheduled]


@dataclasses.dataclass(frozen=True)
class Sampled:
    seq: Sequence
    index: int  # which planned output token was produced
    finished: bool


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_batched_tokens: int, max_seqs: int) -> None:
        if max_batched_tokens < 1 or max_seqs < 1:
            raise ValueError("the step budget and the sequence limit must be positive")
        self.kv = kv
        self.max_batched_tokens = max_batched_tokens
        self.max_seqs = max_seqs
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, seq: Sequence) -> None:
        if seq.finished:
            return
        seq.finished = True
        if seq in self.running:
            self.running.remove(seq)
            self.kv.free(seq.kv)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def schedule(self) -> Step:
        step = Step()
        budget = self._schedule_running(step, self.max_batched_tokens)
        if not step.preempted:
            self._admit_waiting(step, budget)
        return step

    def _schedule_running(self, step: Step, budget: int) -> int:
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            count = min(seq.num_tokens - seq.num_computed, budget)
            if count <= 0:  # cannot happen between steps; kept as a guard
                index += 1
                continue
            while not self.kv.allocate(seq.kv, seq.num_computed, count):
                victim = self.running.pop()
                self._preempt(victim)
                step.preempted.append(victim)
                if victim is seq:
                    return budget
            step.scheduled.append(Scheduled(seq, count, seq.num_computed))
            budget -= count
            index += 1
        return budget

    def _admit_waiting(self, step: Step, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_seqs:
            seq = self.waiting[0]
            hits = self.kv.lookup(seq.kv)
            hit_tokens = len(hits) * self.kv.block_size
            count = min(seq.num_tokens - hit_tokens, budget)
            if not self.kv.allocate(seq.kv, 0, count, hits, reserve_tokens=seq.num_tokens):
                break
            self.waiting.popleft()
            self.running.append(seq)
            first = seq.cached_tokens is None
            if first:
                seq.cached_tokens = hit_tokens
            seq.num_computed = hit_tokens
            step.scheduled.append(Scheduled(seq, count, hit_tokens, first_admission=first))
            budget -= count

    def _preempt(self, seq: Sequence) -> None:
        self.kv.free(seq.kv)
        seq.num_computed = 0
        seq.num_preemptions += 1
        self.waiting.appendleft(seq)

    def complete(self, step: Step) -> list[Sampled]:
        """Apply a finished forward pass: advance computed tokens, sample, retire."""
        sampled = []
        for item in step.scheduled:
            seq = item.seq
            if seq.finished:  # aborted while the step ran
                continue
            seq.num_computed += item.tokens
            if seq.num_computed < seq.num_tokens:
                continue  # a prefill chunk: nothing sampled yet
            index = seq.num_sampled
            seq.num_sampled += 1
            done = seq.num_sampled == len(seq.outputs)
            if done:
                seq.finished = True
                self.running.remove(seq)
                self.kv.free(seq.kv)
            else:
                seq.kv.tokens.append(seq.outputs[index])
            sampled.append(Sampled(seq, index, done))
        return sampled
