"""`KvEventFeed`: the I/O edge of the KV index. Subscribes to the workers' KV events
(topic `kv_events`), applies them through `KvEventSync`, and fetches a worker's full KV
state from its admin endpoint (`AdminRequest(op="kv_state")`) when the worker is
discovered or a gap shows in its events (unless the workers' engine cannot send it:
`KvEventSync.state_available`).
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from stator.protocols import AdminRequest, AdminResponse, KvEvent, KvEventBatch
from stator.router.kv_sync import KvEventSync
from stator.router.metrics import RouterMetrics
from stator.runtime import Client, Runtime
from stator.runtime.errors import RuntimeErrorBase
from stator.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

KV_EVENTS_TOPIC = "kv_events"


class KvEventFeed:
    def __init__(
        self,
        runtime: Runtime,
        client: Client,
        sync: KvEventSync,
        metrics: RouterMetrics,
        *,
        state_timeout: float = 10.0,
        state_attempts: int = 4,
        retry_delay: float = 0.25,
    ) -> None:
        self.runtime = runtime
        self.client = client
        self.sync = sync
        self.metrics = metrics
        self.state_timeout = state_timeout
        self.state_attempts = state_attempts
        self.retry_delay = retry_delay
        self._admin: Client | None = None
        self._task: asyncio.Task | None = None
        self._resyncs: dict[int, asyncio.Task] = {}
        self._subscribed = asyncio.Event()

    async def start(self) -> None:
        self._admin = await self.runtime.client(
            self.client.endpoint.sibling("admin"), AdminResponse
        )
        self._task = asyncio.create_task(self._consume(), name="kv events")
        await self._subscribed.wait()
        # Workers that were up before us: their caches are not empty.
        for worker_id in self.client.instance_ids():
            self.request_resync(worker_id)

    async def _consume(self) -> None:
        subscription = self.runtime.subscribe(KV_EVENTS_TOPIC, KvEventBatch)
        # The subscription exists once the generator has started: prime it.
        first = asyncio.ensure_future(subscription.__anext__())
        await asyncio.sleep(0)
        self._subscribed.set()
        batch = await first
        while True:
            self._apply(batch)
            batch = await subscription.__anext__()

    def _apply(self, batch: KvEventBatch) -> None:
        live = self.client.instances
        for event in batch.events:
            # Events of workers not (yet) discovered are dropped: the gap this leaves is
            # repaired from the worker's state once it is discovered.
            if event.worker_id not in live:
                continue
            gaps = self.sync.gaps
            if self.sync.apply(event):
                self._spawn(event.worker_id)
            elif self.sync.gaps != gaps:
                log.warning(
                    "KV events of worker %x were lost before event %d; its engine cannot "
                    "send its KV state, so its index goes on from here",
                    event.worker_id,
                    event.event_id,
                )
        self.metrics.kv_events.inc(len(batch.events))

    def on_instance(self, worker_id: int, alive: bool) -> None:
        if alive:
            self.request_resync(worker_id)
        else:
            task = self._resyncs.pop(worker_id, None)
            if task is not None:
                task.cancel()
            self.sync.remove_worker(worker_id)

    def request_resync(self, worker_id: int) -> None:
        if not self.sync.state_available:
            return  # nothing to fetch: its events are indexed from the first one seen
        if self.sync.begin_resync(worker_id):
            self._spawn(worker_id)

    def _spawn(self, worker_id: int) -> None:
        if worker_id not in self._resyncs:
            task = asyncio.create_task(self._resync(worker_id), name=f"kv resync {worker_id:x}")
            self._resyncs[worker_id] = task

    async def _resync(self, worker_id: int) -> None:
        try:
            self.metrics.kv_resyncs.inc()
            state = await self._fetch_state(worker_id)
            if not self.sync.resyncing(worker_id):
                return  # removed meanwhile
            if state is None:
                self.sync.abandon_resync(worker_id)
            else:
                self.sync.finish_resync(worker_id, state)
        finally:
            self._resyncs.pop(worker_id, None)

    async def _fetch_state(self, worker_id: int) -> list[KvEvent] | None:
        assert self._admin is not None
        error: Exception | None = None
        for _ in range(self.state_attempts):
            try:
                replies = await asyncio.wait_for(
                    self._admin.call(worker_id, AdminRequest(op="kv_state")), self.state_timeout
                )
                if not replies or not replies[-1].ok:
                    why = replies[-1].error if replies else "no reply"
                    raise RuntimeError(f"kv_state refused: {why}")
                return msgspec.convert(replies[-1].result or [], list[KvEvent])
            except (RuntimeErrorBase, RuntimeError, TimeoutError, msgspec.ValidationError) as exc:
                error = exc
                await asyncio.sleep(self.retry_delay)
        log.warning(
            "cannot fetch the KV state of worker %x (%s); indexing its events from here on",
            worker_id,
            error,
        )
        return None

    async def close(self) -> None:
        await cancel_and_wait([self._task, *self._resyncs.values()])
        if self._admin is not None:
            await self._admin.close()
