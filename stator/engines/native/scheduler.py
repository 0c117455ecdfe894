"""Continuous batching: which sequences compute how many tokens in the next step.

Every step has a token budget. Running sequences go first, oldest first: a decoding one
takes one token, a prefilling one a chunk of its prompt. Waiting sequences are then
admitted while the budget, `max_num_seqs` and the free KV blocks allow, so prefill chunks
and decodes share a step. When a running sequence cannot get a block, the most recently
admitted one is preempted: its blocks are freed and it is recomputed later (its cached
full blocks usually survive in the prefix cache, which makes the recompute cheap).

`num_continuous_decode_steps` N > 1 (SGLang's flag) admits new prompts at most every N
steps while sequences decode: the oldest waiting prompt sits out up to N - 1 steps, and
the prompts that arrived meanwhile are prefilled together. Most steps are then pure decode
steps, at the price of a larger step now and then and a later first token. Prompts left
waiting by the budget, `max_num_seqs` or memory (a backlog, not a gap in arrivals) are
admitted as before, every step, and so is any prompt while nothing decodes (an idle
engine, a prefill worker's chunked prompts).

Admission order (`--scheduling-policy`): `fcfs` admits the oldest waiting sequence first.
`lof` (longest output first, SGLang's `--schedule-policy lof`) admits the one with the
largest `max_tokens` first, ties by arrival: with a backlog, the long outputs start early
and the short ones fill the batch behind them, instead of long ones admitted last
finishing alone at small batches (an H100 run of 1,000 ShareGPT-like requests spent 11.5
of 25.7 s so, at a mean batch of 46). It needs a backlog to help: at concurrency below
`max_num_seqs` nothing waits and the order is moot. It never starves: a sequence is
overtaken by at most `max_overtakes` (default `max_num_seqs`, one batch) sequences that
arrived after it; then it goes first. Sequences that arrived together (an offline batch)
are ordered by length alone; under a steady stream of long requests a short one waits for
what was queued before it plus at most one batch of later arrivals. The oldest waiting
sequence is always the most overtaken (whatever passed a younger one passed it too), so
only it needs checking. Sequences that already hold something go first in either policy:
one preempted after its first token (its output so far is recomputed) or one whose prompt
KV was pulled from a prefill worker (it holds its blocks).
"""

from __future__ import annotations

import itertools
import operator
from collections import deque
from dataclasses import dataclass, field

from stator.engines.native.block_manager import BlockManager
from stator.engines.native.request import Sequence, Status

POLICIES = ("fcfs", "lof")
_max_tokens = operator.attrgetter("sampling.max_tokens")


def check_policy(policy: str) -> None:
    if policy not in POLICIES:
        raise ValueError(
            f"--scheduling-policy (env STATOR_SCHEDULING_POLICY) must be one of "
            f"{', '.join(POLICIES)}, got {policy!r}"
        )


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __bool__(self) -> bool:
        return bool(self.seqs)


class Scheduler:
    def __init__(
        self,
        blocks: BlockManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_prefill_chunk: int = 0,
        max_loras: int = 0,
        num_continuous_decode_steps: int = 1,
        policy: str = "fcfs",
        max_overtakes: int = 0,
    ) -> None:
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be positive")
        if num_continuous_decode_steps < 1:
            raise ValueError(
                "--num-continuous-decode-steps must be 1 or more (0: auto), got "
                f"{num_continuous_decode_steps}"
            )
        check_policy(policy)
        self.blocks = blocks
        self.policy = policy
        # lof: how many later arrivals may pass a waiting sequence (0 = max_num_seqs).
        self.max_overtakes = max_overtakes or max_num_seqs
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_prefill_chunk = max_prefill_chunk
        # The most distinct LoRA adapters running at once (the device's slots); 0 = no limit.
        self.max_loras = max_loras
        self.num_continuous_decode_steps = num_continuous_decode_steps
        self.num_steps = 0  # calls of `schedule`
        self._backlog = False  # the last admission left prompts waiting for capacity
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        seq.queued_at_step = self.num_steps
        seq.overtaken = 0
        self.waiting.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out (finished or aborted) and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free(seq)
        seq.status = Status.FINISHED

    def detach(self, seq: Sequence) -> None:
        """Take a finished sequence out but keep its blocks: their owner now is whoever
        called (a prefill's export, freed on release)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = Status.FINISHED

    def retire(self, seq: Sequence) -> None:
        """Schedule a running sequence no more but keep its blocks: its last token is
        still being computed, and `remove` frees them once it has been read."""
        if seq in self.running:
            self.running.remove(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def queued_prefill_tokens(self) -> int:
        return sum(s.num_tokens - s.num_computed_tokens for s in self.waiting)

    def schedule(self) -> ScheduledBatch:
        self.num_steps += 1
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = self._chunk(seq, budget)
            while not self.blocks.grow(seq, n):
                victim = self.running.pop()
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    break
            else:
                batch.seqs.append(seq)
                batch.num_new_tokens.append(n)
                budget -= n
                i += 1
        if batch.preempted:
            return batch  # memory is short: do not admit anything new this step
        if not self._admitting():
            return batch
        adapters = self._running_adapters()
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            index = self._next_waiting()
            seq = self.waiting[index]
            if seq.lora is not None and adapters is not None and id(seq.lora) not in adapters:
                if len(adapters) >= self.max_loras:
                    break  # every slot is taken by running adapters: wait for one to end
                adapters.add(id(seq.lora))
            n = self._chunk(seq, budget)
            # A sequence whose prompt KV was pulled from a prefill worker already holds
            # its blocks; every other waiting one holds none.
            admitted = self.blocks.grow(seq, n) if seq.block_ids else self.blocks.admit(seq, n)
            if not admitted:
                break
            self._take_waiting(index)
            seq.status = Status.RUNNING
            self.running.append(seq)
            if seq.loading:
                # Part of its prefix is being copied in from a lower tier: it computes from
                # the next step on, while this step's kernels overlap the copy.
                seq.loading = False
                continue
            # The prefix cache may have covered part of the chunk.
            n = min(n, seq.num_tokens - seq.num_computed_tokens)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            budget -= n
        self._backlog = bool(self.waiting)
        return batch

    def _next_waiting(self) -> int:
        """Index in `waiting` of the sequence to admit next (see the module on `lof`)."""
        head = self.waiting[0]
        if (
            self.policy == "fcfs"
            or head.overtaken >= self.max_overtakes
            or head.block_ids
            or head.num_tokens > head.num_prompt_tokens  # preempted: recompute it first
        ):
            return 0
        # max() keeps the first of equals: ties go to the earliest arrival.
        return self.waiting.index(max(self.waiting, key=_max_tokens))

    def _take_waiting(self, index: int) -> None:
        if index == 0:
            self.waiting.popleft()
            return
        taken = self.waiting[index]
        for passed in itertools.islice(self.waiting, index):
            # Only a later arrival (a later step) overtakes: a batch that arrived together
            # is ordered by length alone.
            passed.overtaken += passed.queued_at_step < taken.queued_at_step
        del self.waiting[index]

    def _admitting(self) -> bool:
        """Whether this step may admit waiting sequences: once the oldest has sat out N - 1
        steps, or while nothing decodes (see the module)."""
        if not self.waiting or self.num_continuous_decode_steps == 1 or self._backlog:
            return True
        head = self.waiting[0]
        if head.block_ids:
            return True  # its prompt KV was pulled from a prefill worker: nothing to group
        if self.num_steps - head.queued_at_step >= self.num_continuous_decode_steps:
            return True
        return not any(s.num_computed_tokens >= s.num_prompt_tokens for s in self.running)

    def _running_adapters(self) -> set[int] | None:
        if not self.max_loras:
            return None
        return {id(s.lora) for s in self.running if s.lora is not None}

    def _chunk(self, seq: Sequence, budget: int) -> int:
        n = min(seq.num_tokens - seq.num_computed_tokens, budget)
        if self.max_prefill_chunk > 0:
            n = min(n, self.max_prefill_chunk)
        return n

    def _preempt(self, seq: Sequence) -> None:
        self.num_preemptions += 1
        self.blocks.free(seq)
        seq.num_computed_tokens = 0
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
