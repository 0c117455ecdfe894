"""A vLLM-v1-style scheduler over the simulated KV cache.

Each step has a token budget (`max_num_batched_tokens`). Running sequences are served
first, oldest first: a decoding sequence needs one token, a sequence still prefilling
needs the rest of its prompt (in chunks when chunked prefill is on). What is left goes to
waiting sequences in arrival order, as long as fewer than `max_num_seqs` run and the KV
cache has blocks for them; a prefix already cached is not computed again.

When a running sequence needs a block and none is free, the newest running sequence is
preempted: its blocks are released (they stay as cache), it goes back to the front of the
queue and is recomputed later, from its prompt and the tokens it had generated.

Pure and synchronous: `schedule()` plans a step, `complete()` applies it. The engine loop
sleeps the simulated step time in between and samples the tokens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from stator.engines.mocker.block_manager import BlockManager
from stator.kv.hashing import block_hashes


@dataclass(eq=False, slots=True)
class Sequence:
    """One request's state in the scheduler."""

    request_id: str
    tokens: list[int]  # prompt, then generated tokens
    num_prompt: int
    # Leading prompt tokens whose KV arrives from a prefill worker (decode role).
    num_remote: int = 0
    num_computed: int = 0
    # Prompt tokens found in the prefix cache at first admission (None: not admitted yet).
    num_cached: int | None = None
    block_hashes: list[int] = field(default_factory=list)  # known full-block hashes
    num_held_full: int = 0  # leading blocks held as cached (hashed) blocks
    num_held_partial: int = 0  # further blocks held, not yet full
    num_preemptions: int = 0
    finished: bool = False

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.num_prompt


@dataclass(slots=True)
class ScheduledStep:
    """What one step computes."""

    # (sequence, number of tokens computed for it this step)
    work: list[tuple[Sequence, int]] = field(default_factory=list)
    prefill_tokens: int = 0  # new tokens of sequences that are (re)computing their prompt
    num_decode: int = 0  # sequences computing their one next token
    decode_context: int = 0  # sum of the decoding sequences' lengths
    preempted: list[Sequence] = field(default_factory=list)
    loaded_host: int = 0  # blocks copied back from the host tier for this step
    loaded_disk: int = 0  # ... from the disk tier

    @property
    def empty(self) -> bool:
        return not self.work


class Scheduler:
    def __init__(
        self,
        blocks: BlockManager,
        *,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        enable_chunked_prefill: bool = True,
    ) -> None:
        self.blocks = blocks
        self.block_size = blocks.block_size
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        # (host blocks, disk blocks) -> whether loading them beats recomputing them; None:
        # always load. Set by the engine, which knows the timing model.
        self.should_load: Callable[[int, int], bool] | None = None
        self.num_preemptions = 0

    # -- requests in and out --------------------------------------------------------

    def max_tokens_admissible(self) -> int:
        """The longest sequence that can ever hold its KV in this cache."""
        return self.blocks.num_blocks * self.block_size

    def add(self, seq: Sequence) -> None:
        if not seq.block_hashes:
            seq.block_hashes = block_hashes(seq.tokens, self.block_size)
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> None:
        """Drop a sequence wherever it is and free its blocks at once."""
        if seq.finished:
            return
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._free(seq)
        seq.finished = True

    def finish(self, seq: Sequence) -> None:
        """A sequence is done: free its blocks (they stay as cache)."""
        self.abort(seq)

    def append_token(self, seq: Sequence, token: int) -> None:
        seq.tokens.append(token)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def queued_prefill_tokens(self) -> int:
        queued = sum(len(s.tokens) - s.num_computed for s in self.waiting)
        return queued + sum(
            len(s.tokens) - s.num_computed for s in self.running if s.num_computed < s.num_prompt
        )

    # -- one step -------------------------------------------------------------------

    def schedule(self) -> ScheduledStep:
        step = ScheduledStep()
        budget = self.max_num_batched_tokens
        bs = self.block_size
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(len(seq.tokens) - seq.num_computed, budget)
            need = -(-(seq.num_computed + n) // bs) - seq.num_held_full - seq.num_held_partial
            preempted_self = False
            while need > self.blocks.num_free_blocks:
                victim = self.running.pop()  # the newest running sequence
                self._preempt(victim)
                step.preempted.append(victim)
                if victim is seq:
                    preempted_self = True
                    break
            if preempted_self:
                break
            self._grow(seq, need)
            self._commit_full(seq, seq.num_computed + n)
            self._record(step, seq, n)
            budget -= n
            i += 1
        if step.preempted:
            return step  # as vLLM: no admissions in a step that had to preempt
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            if not self._admit(self.waiting[0], budget, step):
                break
            seq = self.waiting.popleft()
            self.running.append(seq)
            budget -= step.work[-1][1]
        return step

    def complete(self, step: ScheduledStep) -> list[Sequence]:
        """Apply a planned step: advance the computed tokens. Returns the sequences that
        now need a sampled token, in step order."""
        ready = []
        for seq, n in step.work:
            if seq.finished:  # aborted while the step ran
                continue
            seq.num_computed += n
            if seq.num_computed == len(seq.tokens):
                ready.append(seq)
        return ready

    # -- internals ------------------------------------------------------------------

    def _admit(self, seq: Sequence, budget: int, step: ScheduledStep) -> bool:
        """Try to start `seq` this step; on success it is recorded in `step`."""
        bs = self.block_size
        total = len(seq.tokens)
        # At least one token must be computed, so the last block is never a prefix hit.
        limit = (total - 1) // bs
        hits, inactive_hits = self.blocks.match_prefix(seq.block_hashes[:limit])
        lower, disk_only = 0, 0
        tiers = self.blocks.lower
        if tiers is not None and self.blocks.enable_prefix_caching:
            lower, disk_only = tiers.match(seq.block_hashes[hits:limit])
            loader = self.should_load
            if lower and loader is not None and not loader(lower - disk_only, disk_only):
                lower = disk_only = 0  # recomputing is faster
        start = max((hits + lower) * bs, min(seq.num_remote, total - 1))
        n = min(total - start, budget)
        if n < total - start and not self.enable_chunked_prefill:
            return False
        need = -(-(start + n) // bs) - hits
        if need + inactive_hits > self.blocks.num_free_blocks:
            return False
        if lower:
            # Loaded blocks count as computed: they take fresh GPU blocks (allocated with
            # the rest, after the tiers have marked them recent) and are cached below.
            assert tiers is not None
            tiers.load(seq.block_hashes[hits : hits + lower])
            step.loaded_host += lower - disk_only
            step.loaded_disk += disk_only
        self.blocks.acquire_cached(seq.block_hashes[:hits])
        seq.num_held_full = hits
        self._grow(seq, need)
        if seq.num_cached is None:
            seq.num_cached = (hits + lower) * bs
        seq.num_computed = start
        self._commit_full(seq, start + n)
        self._record(step, seq, n)
        return True

    def _record(self, step: ScheduledStep, seq: Sequence, n: int) -> None:
        step.work.append((seq, n))
        if n == 1 and seq.num_computed >= seq.num_prompt:
            step.num_decode += 1
            step.decode_context += seq.num_computed + 1
        else:
            step.prefill_tokens += n

    def _grow(self, seq: Sequence, need: int) -> None:
        if need > 0:
            self.blocks.allocate(need)
            seq.num_held_partial += need

    def _commit_full(self, seq: Sequence, num_tokens: int) -> None:
        """Cache the blocks that are full once `num_tokens` are computed. As in vLLM,
        this happens when the step is scheduled, so a request admitted later in the same
        step already finds them."""
        bs = self.block_size
        full = num_tokens // bs
        k = seq.num_held_full
        if k >= full:
            return
        if len(seq.block_hashes) < full:
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            start = len(seq.block_hashes) * bs
            seq.block_hashes.extend(block_hashes(seq.tokens[start : full * bs], bs, parent=parent))
        tokens = seq.tokens
        hashes = seq.block_hashes
        commit = self.blocks.commit
        for i in range(k, full):
            commit(hashes[i], hashes[i - 1] if i else None, tokens[i * bs : (i + 1) * bs])
        seq.num_held_full = full
        seq.num_held_partial -= full - k

    def _free(self, seq: Sequence) -> None:
        self.blocks.release(seq.block_hashes[: seq.num_held_full], seq.num_held_partial)
        seq.num_held_full = 0
        seq.num_held_partial = 0

    def _preempt(self, seq: Sequence) -> None:
        self._free(seq)
        seq.num_computed = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
