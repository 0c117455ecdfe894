"""Router replicas: several frontends routing to one fleet share their bookings, so that
each sees the load the others put on a worker before that worker's next load report.

Each router publishes what it books (add, first token, finish) on topic `router_load`
and applies what the others publish to its own `LoadTracker`, under the other router's
id. Only load is shared; each replica builds its KV index from the workers' events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from typing import Literal

import msgspec

from stator.router.kv_index import WorkerKey
from stator.router.load import LoadTracker
from stator.runtime import Runtime

log = logging.getLogger(__name__)

ROUTER_LOAD_TOPIC = "router_load"


class LoadSyncEvent(msgspec.Struct, kw_only=True, omit_defaults=True):
    router_id: int
    model: str
    kind: Literal["add", "prefill_done", "finish"]
    request_id: str
    worker_id: int = 0
    dp_rank: int = 0
    prefill_tokens: int = 0
    blocks: int = 0
    hashes: list[int] = msgspec.field(default_factory=list)


class ReplicaSync:
    def __init__(
        self,
        runtime: Runtime,
        model: str,
        tracker: LoadTracker,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.runtime = runtime
        self.model = model
        self.tracker = tracker
        self.on_change = on_change
        self.router_id = random.getrandbits(63)
        self._task: asyncio.Task | None = None
        self._pending: set[asyncio.Task] = set()
        self._subscribed = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._consume(), name="router replica sync")
        await self._subscribed.wait()

    async def _consume(self) -> None:
        subscription = self.runtime.subscribe(ROUTER_LOAD_TOPIC, LoadSyncEvent)
        first = asyncio.ensure_future(subscription.__anext__())
        await asyncio.sleep(0)
        self._subscribed.set()
        event = await first
        while True:
            self.apply(event)
            event = await subscription.__anext__()

    def apply(self, event: LoadSyncEvent) -> None:
        if event.router_id == self.router_id or event.model != self.model:
            return
        rid = f"{event.router_id:x}/{event.request_id}"
        if event.kind == "add":
            key = (event.worker_id, event.dp_rank)
            self.tracker.add(rid, key, event.prefill_tokens, event.blocks, event.hashes)
        elif event.kind == "prefill_done":
            self.tracker.prefill_done(rid)
        else:
            self.tracker.finish(rid)
        self.on_change()

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

    def _simple(self, kind: Literal["prefill_done", "finish"], request_id: str) -> LoadSyncEvent:
        return LoadSyncEvent(
            router_id=self.router_id, model=self.model, kind=kind, request_id=request_id
        )

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        for task in list(self._pending):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
