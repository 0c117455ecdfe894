"""Router replicas: several frontends routing to one fleet share their bookings, so that
each sees the load the others put on a worker before that worker's next load report.

Each router publishes what it books (add, first token, finish) on topic `router_load`
and applies what the others publish to its own `LoadTracker`, under the other router's
id. Only load is shared; each replica builds its KV index from the workers' events.

A frontend that crashes never publishes the finish of what it booked. So each router
also says it is alive every `peer_ttl / 3` seconds, and drops all bookings of a peer it
has not heard from for `peer_ttl` seconds (a peer that comes back later starts afresh:
its bookings from then on count again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from stator.router.kv_index import WorkerKey
from stator.router.load import LoadTracker
from stator.runtime import Runtime
from stator.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

ROUTER_LOAD_TOPIC = "router_load"


class LoadSyncEvent(msgspec.Struct, kw_only=True, omit_defaults=True):
    router_id: int
    model: str
    kind: Literal["add", "prefill_done", "finish", "alive"]
    request_id: str = ""
    worker_id: int = 0
    dp_rank: int = 0
    prefill_tokens: int = 0
    blocks: int = 0
    hashes: list[int] = msgspec.field(default_factory=list)


@dataclass(slots=True)
class _Peer:
    last_seen: float
    bookings: set[str] = field(default_factory=set)  # tracker ids of its open bookings


class ReplicaSync:
    def __init__(
        self,
        runtime: Runtime,
        model: str,
        tracker: LoadTracker,
        on_change: Callable[[], None] = lambda: None,
        *,
        peer_ttl: float = 5.0,
    ) -> None:
        if peer_ttl <= 0:
            raise ValueError("peer_ttl must be positive")
        self.runtime = runtime
        self.model = model
        self.tracker = tracker
        self.on_change = on_change
        self.peer_ttl = peer_ttl
        self.router_id = random.getrandbits(63)
        self._peers: dict[int, _Peer] = {}
        self._task: asyncio.Task | None = None
        self._heartbeat: asyncio.Task | None = None
        self._pending: set[asyncio.Task] = set()
        self._subscribed = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._consume(), name="router replica sync")
        await self._subscribed.wait()
        self._heartbeat = asyncio.create_task(self._beat(), name="router replica heartbeat")

    async def _beat(self) -> None:
        """Say we are alive, and drop the bookings of peers that went silent."""
        while True:
            self._publish(self._simple("alive", ""))
            self.expire(time.monotonic())
            await asyncio.sleep(self.peer_ttl / 3)

    async def _consume(self) -> None:
        subscription = self.runtime.subscribe(ROUTER_LOAD_TOPIC, LoadSyncEvent)
        first = asyncio.ensure_future(subscription.__anext__())
        await asyncio.sleep(0)
        self._subscribed.set()
        event = await first
        while True:
            self.apply(event)
            event = await subscription.__anext__()

    def apply(self, event: LoadSyncEvent, now: float | None = None) -> None:
        if event.router_id == self.router_id or event.model != self.model:
            return
        now = time.monotonic() if now is None else now
        peer = self._peers.get(event.router_id)
        if peer is None:
            peer = self._peers[event.router_id] = _Peer(now)
        peer.last_seen = now
        if event.kind == "alive":
            return
        rid = f"{event.router_id:x}/{event.request_id}"
        if event.kind == "add":
            key = (event.worker_id, event.dp_rank)
            self.tracker.add(rid, key, event.prefill_tokens, event.blocks, event.hashes)
            peer.bookings.add(rid)
        elif event.kind == "prefill_done":
            self.tracker.prefill_done(rid)
        else:
            self.tracker.finish(rid)
            peer.bookings.discard(rid)
        self.on_change()

    def expire(self, now: float) -> int:
        """Forget the peers not heard from for `peer_ttl` seconds, releasing what they
        booked. Returns the number of bookings released."""
        gone = [rid for rid, p in self._peers.items() if now - p.last_seen > self.peer_ttl]
        released = 0
        for router_id in gone:
            peer = self._peers.pop(router_id)
            for rid in peer.bookings:
                released += self.tracker.finish(rid) is not None
            log.warning(
                "router replica %x silent for %.1fs: released its %d bookings",
                router_id,
                now - peer.last_seen,
                len(peer.bookings),
            )
        if released:
            self.on_change()
        return released

    @property
    def peers(self) -> list[int]:
        """Router ids of the replicas heard from within the TTL (or not yet expired)."""
        return list(self._peers)

    def _publish(self, event: LoadSyncEvent) -> None:
        # Fire and forget: a booking must not wait on (or fail with) the event plane.
        task = asyncio.create_task(self.runtime.publish(ROUTER_LOAD_TOPIC, event))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    def added(
        self,
        request_id: str,
        key: WorkerKey,
        prefill_tokens: int,
        blocks: int,
        hashes: list[int] | None = None,
    ) -> None:
        self._publish(
            LoadSyncEvent(
                router_id=self.router_id,
                model=self.model,
                kind="add",
                request_id=request_id,
                worker_id=key[0],
                dp_rank=key[1],
                prefill_tokens=prefill_tokens,
                blocks=blocks,
                hashes=hashes or [],
            )
        )

    def prefill_done(self, request_id: str) -> None:
        self._publish(self._simple("prefill_done", request_id))

    def finished(self, request_id: str) -> None:
        self._publish(self._simple("finish", request_id))

    def _simple(
        self, kind: Literal["prefill_done", "finish", "alive"], request_id: str
    ) -> LoadSyncEvent:
        return LoadSyncEvent(
            router_id=self.router_id, model=self.model, kind=kind, request_id=request_id
        )

    async def close(self) -> None:
        await cancel_and_wait([self._heartbeat, self._task])
        for task in list(self._pending):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
