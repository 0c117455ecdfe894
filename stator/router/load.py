"""`LoadTracker`: the router's view of how busy each (worker, dp_rank) is.

The router books every request it sends: its uncached prompt tokens count as *prefill
load* until the first token comes back, its prompt blocks count as *active KV blocks*
until it finishes. Requests that share a prefix on one worker share its blocks there, so
a block is counted once however many active requests hold it (when the router knows the
prompt's block hashes, i.e. in kv mode; otherwise every request counts all its blocks). Workers' `LoadReport`s correct the block count: a report replaces the
router's estimate with what the engine really holds (including requests other frontends
sent), and the router keeps adding what it booked since. Router replicas share bookings
(`stator.router.replica_sync`), so they are tracked here under the other router's id.

A report cannot see requests still waiting in the engine's queue (they hold no blocks
yet), so the router keeps the blocks of the newest `num_waiting` bookings on that worker
that have not had their first token: without this, each report forgot the queued
requests until the next one, and their finish then took their blocks off a second time,
leaving a worker that had a queue looking lighter than it was.

Pure and synchronous.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from stator.protocols import LoadReport
from stator.router.kv_index import WorkerKey


@dataclass(slots=True)
class Booking:
    key: WorkerKey
    prefill_tokens: int
    hashes: list[int]
    unhashed_blocks: int  # blocks without a hash (a partial last block, or no hashes)
    prefilling: bool = True


@dataclass(slots=True)
class WorkerLoad:
    """One (worker, dp_rank). `blocks_since_report` is what the router booked (minus what
    finished) since the last report, whose count is `reported_blocks`."""

    prefill_tokens: int = 0
    requests: int = 0
    reported_blocks: int = 0
    blocks_since_report: int = 0
    total_blocks: int = 0
    reported_prefill_tokens: int = 0
    reported_requests: int = 0
    has_report: bool = False
    # Block hash -> active requests holding it on this worker.
    active: dict[int, int] = field(default_factory=dict)

    def active_depth(self, hashes: list[int]) -> int:
        """How many leading blocks of `hashes` active requests already hold here."""
        active = self.active
        depth = 0
        for h in hashes:
            if h not in active:
                break
            depth += 1
        return depth

    @property
    def active_blocks(self) -> int:
        return max(0, self.reported_blocks + self.blocks_since_report)

    def load_blocks(self, weight: float, block_size: int) -> float:
        """This worker's load as the kv cost weighs it, without the prompt's own terms:
        `weight * prefill blocks sent and not finished + active KV blocks`. What the
        load-aware simple policies (least-loaded, power-of-two) compare."""
        return weight * self.prefill_tokens / block_size + self.active_blocks

    @property
    def queued_prefill_tokens(self) -> int:
        return max(self.prefill_tokens, self.reported_prefill_tokens)

    @property
    def inflight(self) -> int:
        return self.requests


@dataclass
class LoadTracker:
    default_total_blocks: int = 0
    loads: dict[WorkerKey, WorkerLoad] = field(default_factory=dict)
    bookings: dict[str, Booking] = field(default_factory=dict)

    def load(self, key: WorkerKey) -> WorkerLoad:
        load = self.loads.get(key)
        if load is None:
            load = self.loads[key] = WorkerLoad(total_blocks=self.default_total_blocks)
        return load

    def add(
        self,
        request_id: str,
        key: WorkerKey,
        prefill_tokens: int,
        blocks: int,
        hashes: list[int] | None = None,
    ) -> None:
        """Book a request just sent to `key`: `blocks` KV blocks, of which the first
        `len(hashes)` have these hashes."""
        if request_id in self.bookings:
            self.finish(request_id)
        hashes = hashes or []
        unhashed = max(0, blocks - len(hashes))
        self.bookings[request_id] = Booking(key, prefill_tokens, hashes, unhashed)
        load = self.load(key)
        load.prefill_tokens += prefill_tokens
        active = load.active
        new = unhashed
        for h in hashes:
            count = active.get(h, 0)
            active[h] = count + 1
            new += count == 0
        load.blocks_since_report += new
        load.requests += 1

    def prefill_done(self, request_id: str) -> None:
        """The first token came back: the prompt no longer waits for prefill."""
        booking = self.bookings.get(request_id)
        if booking is None or not booking.prefilling:
            return
        booking.prefilling = False
        load = self.loads.get(booking.key)
        if load is not None:
            load.prefill_tokens -= booking.prefill_tokens

    def finish(self, request_id: str) -> Booking | None:
        """The request ended (finished, failed or cancelled)."""
        self.prefill_done(request_id)
        booking = self.bookings.pop(request_id, None)
        if booking is None:
            return None
        load = self.loads.get(booking.key)
        if load is not None:
            active = load.active
            freed = booking.unhashed_blocks
            for h in booking.hashes:
                count = active.get(h, 0)
                if count <= 1:
                    active.pop(h, None)
                    freed += 1
                else:
                    active[h] = count - 1
            load.blocks_since_report -= freed
            load.requests -= 1
        return booking

    def report(self, report: LoadReport) -> None:
        """A worker told us what it really holds."""
        key = (report.worker_id, report.dp_rank)
        load = self.load(key)
        load.reported_blocks = report.active_kv_blocks
        load.blocks_since_report = self._queued_blocks(key, load, report.num_waiting)
        if report.total_kv_blocks:
            load.total_blocks = report.total_kv_blocks
        load.reported_prefill_tokens = report.queued_prefill_tokens
        load.reported_requests = report.num_running + report.num_waiting
        load.has_report = True

    def _queued_blocks(self, key: WorkerKey, load: WorkerLoad, num_waiting: int) -> int:
        """Blocks of the bookings the engine reports as waiting: the newest `num_waiting`
        on `key` without a first token (the engine admits in arrival order). A block they
        share with an admitted request is already in the report."""
        if num_waiting <= 0:
            return 0
        pending = [b for b in self.bookings.values() if b.key == key and b.prefilling]
        waiting = pending[-num_waiting:]
        holders = Counter(h for b in waiting for h in b.hashes)
        active = load.active
        shared_with_admitted = sum(1 for h, n in holders.items() if active.get(h, 0) > n)
        return sum(b.unhashed_blocks for b in waiting) + len(holders) - shared_with_admitted

    def remove_worker(self, worker_id: int) -> None:
        for rid in [r for r, b in self.bookings.items() if b.key[0] == worker_id]:
            del self.bookings[rid]
        for key in [k for k in self.loads if k[0] == worker_id]:
            del self.loads[key]
