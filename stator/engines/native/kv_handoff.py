"""KV handed from a prefill engine to a decode engine: the prefill side's table of pinned
exports, the decode side's import plan. Pure bookkeeping; `kv/transfer` moves the bytes.

Prefill side: a finished prefill request's sequence keeps its blocks (reference counts
held, so neither a new request nor eviction can reuse them) in the `ExportTable` under a
pin id, until the decode side releases it or its deadline passes. Either way the blocks
go back to the block manager exactly once.

Decode side: `import_plan` pairs the prompt blocks the local prefix cache did not cover
with the remote blocks holding them. While the bytes move, the sequence sits in
`EngineCore.importing`, outside the scheduler; its blocks are its own, so nothing else
writes them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from stator.engines.native.request import Sequence


@dataclass
class Export:
    pin_id: str
    seq: Sequence
    block_ids: list[int]  # the prompt's blocks, in order (the last may be partial)
    deadline: float
    # A decode agent checked the pin to read the blocks (`claim`): from then on only its
    # release unpins them early (it comes after the copy), not the router's.
    claimed: bool = False


class ExportTable:
    """Pinned prompt KV waiting for a decode worker, with a timeout."""

    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout
        self.clock = clock
        self._exports: dict[str, Export] = {}
        # Pin ids released before anything was pinned under them (`release(..., later=
        # True)`: the router's caller left while the prefill ran) -> until when a pin made
        # under one is dropped at once. In deadline order (one timeout for all).
        self._released_early: dict[str, float] = {}
        self.num_expired = 0
        self.num_released = 0
        self.num_released_at_pin = 0

    def __len__(self) -> int:
        return len(self._exports)

    def pin(self, pin_id: str, seq: Sequence, num_prompt_tokens: int, block_size: int) -> Export:
        blocks = -(-num_prompt_tokens // block_size)
        export = Export(pin_id, seq, list(seq.block_ids[:blocks]), self.clock() + self.timeout)
        self._exports[pin_id] = export
        return export

    def get(self, pin_id: str) -> Export | None:
        return self._exports.get(pin_id)

    def claim(self, pin_id: str) -> None:
        """A decode agent found the pin and reads the blocks now: the pin lasts at least
        `timeout` more (an answer given just before the deadline must not let the blocks
        go while the copy runs)."""
        export = self._exports.get(pin_id)
        if export is not None:
            export.claimed = True
            export.deadline = max(export.deadline, self.clock() + self.timeout)

    def release(
        self, pin_id: str, unless_claimed: bool = False, later: bool = False
    ) -> Sequence | None:
        """The sequence whose blocks to free now, or None if nothing is pinned there (or,
        `unless_claimed`, a decode agent is reading it: its own release will come).
        `later`: when nothing is pinned there yet, a pin made under `pin_id` within the
        timeout is released as it is made (`released_early`)."""
        export = self._exports.get(pin_id)
        if export is None and later:
            self._forget_old_early_releases()
            self._released_early[pin_id] = self.clock() + self.timeout
        if export is None or (unless_claimed and export.claimed):
            return None
        del self._exports[pin_id]
        self.num_released += 1
        return export.seq

    def released_early(self, pin_id: str) -> bool:
        """Whether `pin_id` was released (`later`) before it was pinned, within the
        timeout: its new pin is to go at once (counted in `num_released_at_pin`)."""
        self._forget_old_early_releases()
        if self._released_early.pop(pin_id, None) is None:
            return False
        self.num_released_at_pin += 1
        return True

    def _forget_old_early_releases(self) -> None:
        now = self.clock()
        while self._released_early:
            pin_id, until = next(iter(self._released_early.items()))
            if until > now:
                return
            del self._released_early[pin_id]

    def expire(self) -> list[Sequence]:
        """Sequences whose pins ran out (to free now)."""
        now = self.clock()
        gone = [e for e in self._exports.values() if e.deadline <= now]
        for export in gone:
            del self._exports[export.pin_id]
        self.num_expired += len(gone)
        return [e.seq for e in gone]

    def next_deadline(self) -> float | None:
        return min((e.deadline for e in self._exports.values()), default=None)

    def drain(self) -> list[Sequence]:
        seqs = [e.seq for e in self._exports.values()]
        self._exports.clear()
        return seqs


@dataclass
class ImportPlan:
    """Copy remote block `remote[i]` into local block `local[i]`, for each i."""

    request_id: str
    remote: list[int]
    local: list[int]
    num_cached_blocks: int  # leading prompt blocks the local prefix cache already held
    num_tokens: int = 0  # prompt tokens whose KV the pull completes
    aborted: bool = False
    seq: Sequence | None = field(default=None, repr=False)


def import_plan(
    seq: Sequence, remote_block_ids: list[int], num_remote_tokens: int, block_size: int
) -> ImportPlan:
    """For a sequence just admitted with its local prefix hits: which remote blocks to
    pull. The prompt's KV covers `num_remote_tokens` tokens in `remote_block_ids`."""
    blocks = -(-num_remote_tokens // block_size)
    if len(remote_block_ids) < blocks:
        raise ValueError(
            f"{len(remote_block_ids)} remote blocks cannot hold {num_remote_tokens} tokens"
        )
    cached = seq.num_computed_tokens // block_size
    return ImportPlan(
        request_id=seq.request_id,
        remote=list(remote_block_ids[cached:blocks]),
        local=list(seq.block_ids[cached:blocks]),
        num_cached_blocks=cached,
        seq=seq,
    )
