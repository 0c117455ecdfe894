"""`Router`: one per model in a frontend. Picks a live worker for each request, books
the load it puts there, streams the worker's outputs back, and moves the stream to
another worker if its worker dies (migration).

The decisions are made by the pure cores (`policies`, `cost`, `kv_index`, `approx`,
`load`, `busy`); this class wires them to the runtime: the client's live instances, KV
events and load reports from the event plane, the admission queue.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Callable, Collection
from typing import Any

import msgspec
from prometheus_client import CollectorRegistry

from stator.kv.hashing import block_hashes
from stator.protocols import EngineOutput, EngineRequest, LoadReport, ModelCard, RoutingHints
from stator.router.approx import ApproxKvIndex
from stator.router.busy import AdmissionQueue, BusyThresholds, is_busy
from stator.router.config import RouterConfig
from stator.router.cost import Candidate, choose
from stator.router.errors import BadRouting, Overloaded
from stator.router.kv_feed import KvEventFeed
from stator.router.kv_index import KvIndex, WorkerKey
from stator.router.kv_sync import KvEventSync
from stator.router.load import LoadTracker
from stator.router.metrics import router_metrics
from stator.router.migration import migrating
from stator.router.policies import SIMPLE_POLICIES, make_policy
from stator.router.replica_sync import ReplicaSync
from stator.runtime import Client, NoInstances, Runtime
from stator.runtime.names import InstanceInfo
from stator.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)


def prompt_length(request: EngineRequest) -> int:
    """Tokens the prompt takes in the worker's context: its ids, or its embedding rows."""
    shape = request.prompt_embeds_shape
    return shape[0] if request.prompt_embeds is not None and shape else len(request.token_ids)


LOAD_TOPIC = "load"
_UNCHANGED: Any = object()


class Router:
    """`runtime` gives access to the event plane (KV events, load reports); `client`
    tracks the model's live workers; `card` gives the block size and KV capacity."""

    def __init__(
        self,
        runtime: Runtime,
        client: Client,
        card: ModelCard,
        config: RouterConfig,
        *,
        registry: CollectorRegistry | None = None,
        allowed_workers: Callable[[], Collection[int]] | None = None,
    ) -> None:
        config.validate()
        # Where set, only these workers may serve (a LoRA adapter's: those that loaded it).
        self.allowed_workers = allowed_workers
        self.runtime = runtime
        self.client = client
        self.card = card
        self.config = config
        self.mode = config.router_mode
        self.block_size = card.kv_block_size
        self.ranks = max(1, card.data_parallel_size)
        self.rng = random.Random(config.router_seed)
        self.metrics = router_metrics(registry)
        # Present from the start (0), so that dashboards show an empty queue, not no data.
        self.metrics.queue_length.labels(card.name).set(0)
        self.load = LoadTracker(default_total_blocks=card.total_kv_blocks)
        self.thresholds = config.busy_thresholds()
        self.queue = AdmissionQueue(config.router_queue_size, config.router_queue_policy)
        self.migration_limit = (
            card.migration_limit if config.migration_limit is None else config.migration_limit
        )
        self.rejected = 0
        self.policy = make_policy(self.mode, self.rng) if self.mode in SIMPLE_POLICIES else None
        self.index: KvIndex | None = None
        self.approx: ApproxKvIndex | None = None
        self.feed: KvEventFeed | None = None
        if self.mode == "kv":
            if config.router_kv_events:
                self.index = KvIndex(self.block_size, config.router_kv_index_jump)
                sync = KvEventSync(self.index, state_available=card.kv_state_available)
                self.feed = KvEventFeed(runtime, client, sync, self.metrics)
            else:
                self.approx = ApproxKvIndex(
                    self.block_size, config.router_ttl, config.router_max_tree_size
                )
        self.replicas = (
            ReplicaSync(
                runtime,
                card.name,
                self.load,
                self.queue.wake,
                peer_ttl=config.router_replica_ttl,
            )
            if config.router_replica_sync
            else None
        )
        self._ids = itertools.count()
        self._tasks: list[asyncio.Task] = []
        self._started = False

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        self.client.on_change(self._on_instance)
        if self.feed is not None:
            await self.feed.start()
        if self.replicas is not None:
            await self.replicas.start()
        ready = asyncio.Event()
        self._tasks.append(asyncio.create_task(self._consume_load(ready), name="load reports"))
        await ready.wait()

    async def close(self) -> None:
        await cancel_and_wait(self._tasks)
        self._tasks.clear()
        if self.feed is not None:
            await self.feed.close()
        if self.replicas is not None:
            await self.replicas.close()

    async def _consume_load(self, ready: asyncio.Event) -> None:
        subscription = self.runtime.subscribe(LOAD_TOPIC, LoadReport)
        first = asyncio.ensure_future(subscription.__anext__())
        await asyncio.sleep(0)
        ready.set()
        report = await first
        while True:
            if report.worker_id in self.client.instances:
                self.load.report(report)
                self.queue.wake()
            report = await subscription.__anext__()

    def _on_instance(self, worker_id: int, info: InstanceInfo | None) -> None:
        if info is None:
            self.load.remove_worker(worker_id)
            if self.approx is not None:
                self.approx.remove_worker(worker_id)
        if self.feed is not None:
            self.feed.on_instance(worker_id, info is not None)

    # -- busy thresholds (GET/POST /busy_threshold) -----------------------------------

    def busy_thresholds(self) -> dict[str, float | int | None]:
        return {
            "active_decode_blocks_threshold": self.thresholds.active_decode_blocks_threshold,
            "active_prefill_tokens_threshold": self.thresholds.active_prefill_tokens_threshold,
        }

    def set_busy_thresholds(
        self,
        active_decode_blocks_threshold: float | None = _UNCHANGED,
        active_prefill_tokens_threshold: int | None = _UNCHANGED,
    ) -> dict[str, float | int | None]:
        """Change the thresholds (None disables one; an omitted one is unchanged). Raises
        ValueError for a bad value, leaving the thresholds as they were."""
        new = BusyThresholds(
            self.thresholds.active_decode_blocks_threshold
            if active_decode_blocks_threshold is _UNCHANGED
            else active_decode_blocks_threshold,
            self.thresholds.active_prefill_tokens_threshold
            if active_prefill_tokens_threshold is _UNCHANGED
            else active_prefill_tokens_threshold,
        )
        new.validate()
        self.thresholds = new
        self.queue.wake()
        return self.busy_thresholds()

    # -- serving ---------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        model = self.card.name

        def on_migrate(ongoing: bool) -> None:
            kind = "ongoing_request" if ongoing else "new_request"
            self.metrics.migrations.labels(model, kind).inc()

        async for output in migrating(request, self._attempt, self.migration_limit, on_migrate):
            yield output

    async def _attempt(
        self, request: EngineRequest, tried: set[int]
    ) -> AsyncIterator[EngineOutput]:
        """One try: admit, choose, book, stream."""
        keys = await self._admit(request, tried)
        started = time.perf_counter()
        hashes = self._hashes(request) if self.mode == "kv" else []
        key, overlap = self._choose(request, keys, hashes)
        tried.add(key[0])
        self._record_decision(request, key, overlap, hashes, started)
        booking = f"{request.request_id}#{next(self._ids)}"
        prompt = prompt_length(request)
        prefill = max(0, round(prompt - overlap * self.block_size))
        blocks = math.ceil(prompt / self.block_size)
        self.load.add(booking, key, prefill, blocks, hashes)
        if self.replicas is not None:
            self.replicas.added(booking, key, prefill, blocks, hashes)
        if self.ranks > 1:
            routing = request.routing or RoutingHints()
            request = msgspec.structs.replace(
                request, routing=msgspec.structs.replace(routing, dp_rank=key[1])
            )
        stream = self.client.generate(key[0], request)
        first = True
        try:
            async for output in stream:
                if first:
                    first = False
                    self._prefill_done(booking)
                yield output
        finally:
            await stream.aclose()
            self.load.finish(booking)
            if self.replicas is not None:
                self.replicas.finished(booking)
            self.queue.wake()

    def _prefill_done(self, booking: str) -> None:
        self.load.prefill_done(booking)
        if self.replicas is not None:
            self.replicas.prefill_done(booking)
        self.queue.wake()

    def _hashes(self, request: EngineRequest) -> list[int]:
        return block_hashes(request.token_ids, self.block_size, lora_name=request.lora_name)

    def candidates(self, exclude: set[int] | frozenset[int] = frozenset()) -> list[WorkerKey]:
        """Every live (worker, dp_rank), less the workers in `exclude`."""
        ids = self.client.instance_ids()
        if self.allowed_workers is not None:
            allowed = self.allowed_workers()
            ids = [wid for wid in ids if wid in allowed]
        return [
            (wid, rank) for wid in sorted(ids) if wid not in exclude for rank in range(self.ranks)
        ]

    def _eligible(self, request: EngineRequest, tried: set[int]) -> list[WorkerKey]:
        """Live candidates that are not busy. Raises when there are none at all; returns
        [] when all are busy."""
        target = request.routing.target_worker_id if request.routing else None
        if target is not None and target not in tried:
            if target not in self.client.instances:
                raise NoInstances(f"worker {target:x} named by the request is not live")
            keys = [(target, r) for r in range(self.ranks)]
        elif self.mode == "direct" and not tried:
            raise BadRouting("router mode 'direct' needs the request to name a worker")
        else:
            keys = self.candidates(tried)
        if not keys:
            what = "other " if tried else ""
            raise NoInstances(f"no {what}live worker serves {request.model}")
        if not self.thresholds.enabled:
            return keys
        free = [k for k in keys if not is_busy(self.load.load(k), self.thresholds)]
        return free

    async def _admit(self, request: EngineRequest, tried: set[int]) -> list[WorkerKey]:
        """The candidates that are not busy, as soon as there are some: waits in the queue
        or raises `Overloaded` while all are busy."""
        keys = self._eligible(request, tried)
        if keys and not len(self.queue):
            return keys
        if self.queue.full:
            self._reject()
        model = self.card.name
        ticket = self.queue.enter(request.priority)
        self.metrics.queue_length.labels(model).set(len(self.queue))
        deadline = time.monotonic() + self.config.router_queue_timeout
        try:
            while True:
                if self.queue.is_head(ticket):
                    keys = self._eligible(request, tried)
                    if keys:
                        return keys
                if time.monotonic() >= deadline:
                    self._reject()
                await self.queue.wait_turn(ticket)
        finally:
            self.queue.leave(ticket)
            self.metrics.queue_length.labels(model).set(len(self.queue))

    def _reject(self) -> None:
        self.rejected += 1
        self.metrics.rejections.labels(self.card.name).inc()
        raise Overloaded("All workers are busy", retry_after=1.0)

    def _choose(
        self, request: EngineRequest, keys: list[WorkerKey], hashes: list[int]
    ) -> tuple[WorkerKey, float]:
        """(chosen candidate among `keys`, prompt blocks cached there; a block in a lower
        tier counts as a fraction)."""
        if self.mode != "kv":
            if len(keys) == 1:
                return keys[0], 0
            assert self.policy is not None or self.mode == "direct"
            policy = self.policy or make_policy("least-loaded", self.rng)
            weight, size, load = self._weight(request), self.block_size, self.load.load
            return policy.select(keys, lambda k: load(k).load_blocks(weight, size)), 0
        if self.index is not None:
            tiers = {
                "host": self.config.kv_host_overlap_weight,
                "disk": self.config.kv_disk_overlap_weight,
            }
            matches = self.index.find_weighted(hashes, tiers)
            tree_size = self.index.tree_size
        else:
            assert self.approx is not None
            matches = self.approx.find_matches(hashes, time.monotonic())
            tree_size = self.approx.tree_size
        weight = self._weight(request)
        candidates = []
        for key in keys:
            load = self.load.load(key)
            candidates.append(
                Candidate(
                    key=key,
                    overlap_blocks=matches.get(key, 0),
                    cached_blocks=tree_size(key),
                    inflight_prefill_tokens=load.prefill_tokens,
                    active_blocks=load.active_blocks,
                    active_overlap=load.active_depth(hashes),
                )
            )
        choice = choose(
            candidates,
            prompt_length(request),
            self.block_size,
            weight,
            self.config.router_temperature,
            self.rng,
        )
        if self.approx is not None:
            self.approx.record(choice.key, hashes, time.monotonic())
        return choice.key, choice.overlap_blocks

    def _weight(self, request: EngineRequest) -> float:
        """The weight of prefill against decode blocks: the request's own, or the config's."""
        if request.routing is not None and request.routing.overlap_weight is not None:
            return request.routing.overlap_weight
        return self.config.kv_overlap_score_weight

    def _record_decision(
        self,
        request: EngineRequest,
        key: WorkerKey,
        overlap: float,
        hashes: list[int],
        started: float,
    ) -> None:
        model = self.card.name
        self.metrics.routing_seconds.labels(model).observe(time.perf_counter() - started)
        self.metrics.decisions.labels(model, self.mode).inc()
        if self.mode == "kv":
            self.metrics.overlap_blocks.labels(model).observe(overlap)
            if hashes:
                self.metrics.predicted_hit_rate.labels(model).observe(overlap / len(hashes))
        log.debug(
            "request %s -> worker %x rank %d (%.4g cached blocks)",
            request.request_id,
            key[0],
            key[1],
            overlap,
        )
