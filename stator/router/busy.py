"""Overload: when is a worker busy, and what waits while all of them are.

A (worker, dp_rank) is busy when its active KV blocks exceed a fraction of its capacity,
or when the prefill it has queued exceeds a number of tokens. A worker is busy only when
all its ranks are. When every worker is busy, new requests wait in a bounded queue
(first come first served, or by `EngineRequest.priority`), or, with no room left, are
rejected (`Overloaded` -> HTTP 503 with Retry-After).

`BusyThresholds` and `is_busy` are pure; `AdmissionQueue` is the small asyncio edge that
parks requests and wakes them when load drops.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from dataclasses import dataclass

from stator.router.load import WorkerLoad


@dataclass(slots=True)
class BusyThresholds:
    # Busy above this fraction of the rank's KV blocks in use (None: never).
    active_decode_blocks_threshold: float | None = None
    # Busy above this many prompt tokens queued for prefill (None: never).
    active_prefill_tokens_threshold: int | None = None

    def validate(self) -> None:
        frac = self.active_decode_blocks_threshold
        if frac is not None and not 0.0 < frac <= 1.0:
            raise ValueError(f"active_decode_blocks_threshold must be in (0, 1], got {frac}")
        tokens = self.active_prefill_tokens_threshold
        if tokens is not None and tokens < 0:
            raise ValueError(f"active_prefill_tokens_threshold must be >= 0, got {tokens}")

    @property
    def enabled(self) -> bool:
        return (
            self.active_decode_blocks_threshold is not None
            or self.active_prefill_tokens_threshold is not None
        )


def is_busy(load: WorkerLoad, thresholds: BusyThresholds) -> bool:
    frac = thresholds.active_decode_blocks_threshold
    if frac is not None and load.total_blocks > 0 and load.active_blocks > frac * load.total_blocks:
        return True
    tokens = thresholds.active_prefill_tokens_threshold
    return tokens is not None and load.queued_prefill_tokens > tokens


QUEUE_POLICIES = ["fcfs", "priority"]


class Ticket:
    """A place in the admission queue."""

    __slots__ = ("woken",)

    def __init__(self) -> None:
        self.woken = asyncio.Event()


class AdmissionQueue:
    """Requests waiting for a worker to stop being busy. Only the head of the queue may
    take a worker; the others wait behind it. `wait_turn()` returns when `wake()` was
    called (load dropped) or after `recheck` seconds (load reports may have changed
    things without a wake)."""

    def __init__(self, capacity: int, policy: str = "fcfs", recheck: float = 0.25) -> None:
        if policy not in QUEUE_POLICIES:
            raise ValueError(f"queue policy must be one of {QUEUE_POLICIES}, got {policy!r}")
        self.capacity = capacity
        self.policy = policy
        self.recheck = recheck
        self._heap: list[tuple[int, int, Ticket]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    @property
    def full(self) -> bool:
        return len(self._heap) >= self.capacity

    def _key(self, priority: int) -> int:
        # Higher EngineRequest.priority is served first under the priority policy.
        return -priority if self.policy == "priority" else 0

    def enter(self, priority: int) -> Ticket:
        """Take a place in the queue (the caller checked `full`)."""
        ticket = Ticket()
        heapq.heappush(self._heap, (self._key(priority), next(self._seq), ticket))
        return ticket

    def is_head(self, ticket: Ticket) -> bool:
        return bool(self._heap) and self._heap[0][2] is ticket

    async def wait_turn(self, ticket: Ticket) -> None:
        # No await between the caller's busy check and here, so no wake can be lost.
        ticket.woken.clear()
        try:
            await asyncio.wait_for(ticket.woken.wait(), self.recheck)
        except TimeoutError:
            pass

    def leave(self, ticket: Ticket) -> None:
        for i, entry in enumerate(self._heap):
            if entry[2] is ticket:
                self._heap.pop(i)
                heapq.heapify(self._heap)
                break
        self.wake()

    def wake(self) -> None:
        """Load dropped (a request finished or got its first token): let the head try."""
        if self._heap:
            self._heap[0][2].woken.set()
