"""`KvEventSync`: applies workers' KV events to a `KvIndex` in order, and notices when
events were lost.

Every (worker, dp_rank) numbers its events 1, 2, 3, ... (`KvEvent.event_id`). A jump, or a
first event from a worker we never heard from that is not its first, means the index no
longer mirrors that worker: the caller fetches the worker's full KV state (its admin
endpoint's `kv_state` op) and hands it to `finish_resync`. Events that arrive while the
state is being fetched are buffered and replayed on top of it.

A worker whose engine cannot dump its state (`ModelCard.kv_state_available` false: vLLM)
is never asked for it: a gap is counted and bridged, the index keeps what it knew and goes
on from the event after the gap (blocks stored or removed in the lost events stay unknown;
a wrong guess costs a worse route, never a wrong answer).

Pure and synchronous; the fetching is done by `stator.router.kv_feed`.
"""

from __future__ import annotations

from stator.protocols import KvEvent
from stator.router.kv_index import KvIndex, WorkerKey

# Producers may number from 0 or from 1; either is a clean start.
_FIRST_IDS = (0, 1)


class KvEventSync:
    def __init__(self, index: KvIndex, *, state_available: bool = True) -> None:
        self.index = index
        self.state_available = state_available
        self._last: dict[WorkerKey, int] = {}
        # Workers resynced from a state that did not say where in their event sequence
        # it was taken: a rank with no known position takes its next event, whatever its
        # id, as the baseline (instead of resyncing again and again).
        self._baseline_next: set[int] = set()
        self._resyncing: dict[int, list[KvEvent]] = {}
        self.gaps = 0

    def resyncing(self, worker_id: int) -> bool:
        return worker_id in self._resyncing

    def apply(self, event: KvEvent) -> bool:
        """Apply one event. True when the worker must be resynced (the caller fetches
        its state, then calls `finish_resync` or `abandon_resync`); never without
        `state_available`."""
        wid = event.worker_id
        buffered = self._resyncing.get(wid)
        if buffered is not None:
            buffered.append(event)
            return False
        key = (wid, event.dp_rank)
        last = self._last.get(key)
        if last is None:
            # Without a state to fetch, whatever we hear first is where we start.
            late = event.event_id not in _FIRST_IDS and self.state_available
            if late and wid not in self._baseline_next:
                return self._gap(event)
        elif event.event_id <= last:
            return False  # a duplicate (replayed after a resync): already applied
        elif event.event_id != last + 1:
            return self._gap(event)
        self.index.apply(key, event.data)
        self._last[key] = event.event_id
        return False

    def _gap(self, event: KvEvent) -> bool:
        self.gaps += 1
        if not self.state_available:
            key = (event.worker_id, event.dp_rank)
            self.index.apply(key, event.data)
            self._last[key] = event.event_id
            return False
        self._resyncing[event.worker_id] = [event]
        return True

    def begin_resync(self, worker_id: int) -> bool:
        """Start buffering a worker's events (e.g. when it is first discovered). False if
        a resync is already under way."""
        if worker_id in self._resyncing:
            return False
        self._resyncing[worker_id] = []
        return True

    def finish_resync(self, worker_id: int, state: list[KvEvent]) -> None:
        """Replace everything known about `worker_id` by `state` (its full KV state as
        stored events), then replay the events buffered meanwhile that are newer."""
        buffered = self._resyncing.pop(worker_id, [])
        keys = {k for k in self.index.workers() if k[0] == worker_id}
        keys |= {k for k in self._last if k[0] == worker_id}
        for key in keys:
            self.index.clear(key)
            self._last.pop(key, None)
        taken_at: dict[int, int] = {}
        for event in state:
            if event.worker_id != worker_id:
                continue
            self.index.apply((worker_id, event.dp_rank), event.data)
            rank = event.dp_rank
            taken_at[rank] = max(taken_at.get(rank, event.event_id), event.event_id)
        self._replay(worker_id, buffered, taken_at)

    def abandon_resync(self, worker_id: int) -> None:
        """The state could not be fetched: keep going with what the events say."""
        self._replay(worker_id, self._resyncing.pop(worker_id, []), {})

    def _replay(self, worker_id: int, buffered: list[KvEvent], taken_at: dict[int, int]) -> None:
        ranks = {e.dp_rank for e in buffered} | set(taken_at)
        for rank in ranks:
            key = (worker_id, rank)
            position = taken_at.get(rank)
            newer = sorted(
                (
                    e
                    for e in buffered
                    if e.dp_rank == rank and (position is None or e.event_id > position)
                ),
                key=lambda e: e.event_id,
            )
            for event in newer:
                self.index.apply(key, event.data)
            if newer:
                self._last[key] = newer[-1].event_id
            else:
                self._last.pop(key, None)
        self._baseline_next.add(worker_id)

    def remove_worker(self, worker_id: int) -> None:
        self._resyncing.pop(worker_id, None)
        for key in [k for k in self._last if k[0] == worker_id]:
            del self._last[key]
        self._baseline_next.discard(worker_id)
        self.index.remove_worker(worker_id)
