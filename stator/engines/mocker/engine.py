"""`MockerEngine`: the scheduler, block manager and timing model behind the `Engine` API.

One asyncio task per data-parallel rank runs steps: plan (scheduler), sleep the simulated
step time, apply, then hand each sequence its sampled token. Tokens go into a per-request
buffer and wake the request's stream; a stream that wakes late takes all buffered tokens
at once, so a slow consumer costs one wake-up, not one per token. KV events are drained
once per step, as one batch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import msgspec

from stator.engines.base import Engine, EngineDead, EngineError
from stator.engines.mocker.admission import admitted_max_tokens
from stator.engines.mocker.block_manager import BlockManager
from stator.engines.mocker.config import MockerConfig
from stator.engines.mocker.kv_copies import KvCopyTimes
from stator.engines.mocker.output import TokenPlan
from stator.engines.mocker.scheduler import Scheduler, Sequence
from stator.engines.mocker.stream import RequestStream
from stator.engines.mocker.timing import PolynomialTiming, ProfileTiming, StepShape, StepTimer
from stator.kv.hashing import block_hashes
from stator.protocols import (
    DisaggParams,
    EngineOutput,
    EngineRequest,
    KvEvent,
    LoadReport,
    ModelCard,
)

log = logging.getLogger(__name__)

# Event batches kept for a slow (or absent) consumer before the oldest are dropped; the
# event-id gap then tells the consumer to resync from `kv_state()`.
MAX_PENDING_EVENT_BATCHES = 1024
# How far (seconds) the simulated clock may run behind the wall clock before it gives up
# catching up.
MAX_CATCH_UP = 0.005


@dataclass(eq=False)
class Rank:
    """One data-parallel rank: its own KV cache and scheduler, and its step-loop task."""

    index: int
    blocks: BlockManager
    scheduler: Scheduler
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None


class MockerEngine(Engine):
    def __init__(
        self,
        config: MockerConfig,
        card: ModelCard,
        *,
        vocab_size: int,
        kv_bytes_per_token: int,
    ) -> None:
        config.validate()
        self.config = config
        self.card = card
        self.role = config.role  # type: ignore[assignment]
        self.vocab_size = vocab_size
        self.kv_bytes_per_token = kv_bytes_per_token
        model = ProfileTiming.from_file(config.profile) if config.profile else PolynomialTiming()
        self.timer = StepTimer(
            model,
            speedup_ratio=config.speedup_ratio,
            decode_speedup_ratio=config.decode_speedup_ratio,
            prefill_only=config.role == "prefill",
        )
        self.kv_copies = KvCopyTimes(config, kv_bytes_per_token, model)
        self.transferred_tokens = 0
        self.num_transfers = 0
        self.ranks = [
            Rank(
                i,
                blocks,
                Scheduler(
                    blocks,
                    max_num_seqs=config.max_num_seqs,
                    max_num_batched_tokens=config.max_num_batched_tokens,
                    enable_chunked_prefill=config.enable_chunked_prefill,
                ),
            )
            for i in range(config.data_parallel_size)
            for blocks in [
                BlockManager(
                    config.num_gpu_blocks,
                    config.block_size,
                    enable_prefix_caching=config.enable_prefix_caching,
                    dp_rank=i,
                )
            ]
        ]
        for rank in self.ranks:
            rank.blocks.enable_tiers(config.host_cache_blocks, config.disk_cache_blocks)
            rank.scheduler.should_load = self.kv_copies.should_load
        self._streams: dict[str, RequestStream] = {}
        self._events: asyncio.Queue[list[KvEvent]] = asyncio.Queue()
        self._dead: str | None = None
        self.num_requests = 0

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        # The worker host may have set the role after construction.
        self.timer.prefill_only = self.role == "prefill"
        if self.config.startup_time > 0:
            await asyncio.sleep(self.config.startup_time)
        for rank in self.ranks:
            rank.blocks.worker_id = self.worker_id
            rank.task = asyncio.create_task(self._run(rank), name=f"mocker-rank-{rank.index}")

    async def shutdown(self) -> None:
        for rank in self.ranks:
            if rank.task is not None:
                rank.task.cancel()
        for rank in self.ranks:
            if rank.task is not None:
                try:
                    await rank.task
                except (asyncio.CancelledError, Exception):
                    pass
                rank.task = None
        for rid in list(self._streams):
            await self.abort(rid)

    async def health_check(self) -> None:
        if self._dead:
            raise EngineDead(self._dead)

    # -- requests -------------------------------------------------------------------

    def _validate(self, request: EngineRequest) -> int:
        """Check a request; returns its max_tokens."""
        if self._dead:
            raise EngineDead(self._dead)
        if not any(rank.task for rank in self.ranks):
            raise EngineError("the mocker is not started")
        if request.request_id in self._streams:
            raise EngineError(f"request id {request.request_id!r} is already running")
        return admitted_max_tokens(
            request,
            self.config,
            self.card.context_length,
            self.role,
            self.ranks[0].scheduler.max_tokens_admissible(),
        )

    def _pick_rank(self, request: EngineRequest) -> Rank:
        wanted = request.routing.dp_rank if request.routing else None
        if wanted is not None and 0 <= wanted < len(self.ranks):
            return self.ranks[wanted]
        return min(self.ranks, key=lambda r: len(r.scheduler.running) + len(r.scheduler.waiting))

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        max_tokens = self._validate(request)
        num_remote = 0
        rank = self._pick_rank(request)
        if self.role == "decode" and request.disagg is not None:
            num_remote = request.disagg.num_prompt_tokens or len(request.token_ids)
            num_remote = min(num_remote, len(request.token_ids))
            # Only the blocks this worker does not already cache cross the link.
            bs = self.config.block_size
            hashes = block_hashes(request.token_ids[: num_remote // bs * bs], bs)
            hits, _ = rank.blocks.match_prefix(hashes)
            missing = max(0, num_remote - hits * bs)
            self.transferred_tokens += missing
            self.num_transfers += 1
            delay = self.kv_copies.transfer_seconds(missing)
            if delay > 0:
                await asyncio.sleep(delay)
        seq = Sequence(
            request.request_id,
            list(request.token_ids),
            len(request.token_ids),
            num_remote=num_remote,
        )
        plan = TokenPlan(request, self.config.output_mode, self.vocab_size, max_tokens)  # type: ignore[arg-type]
        stream = RequestStream(
            seq, plan, rank, logprobs=request.sampling.logprobs, vocab_size=self.vocab_size
        )
        self._streams[request.request_id] = stream
        self.num_requests += 1
        rank.scheduler.add(seq)
        rank.wake.set()
        finished = False
        try:
            while not finished:
                await stream.ready.wait()
                stream.ready.clear()
                out = stream.take()
                finished = out.finish_reason is not None
                yield out
        finally:
            if self._streams.get(request.request_id) is stream:
                del self._streams[request.request_id]
            if not seq.finished:  # the caller went away: free the blocks now
                rank.scheduler.abort(seq)
                self._publish(rank)

    async def abort(self, request_id: str) -> None:
        stream = self._streams.get(request_id)
        if stream is None or stream.finish_reason is not None:
            return
        stream.rank.scheduler.abort(stream.seq)
        self._publish(stream.rank)
        stream.finish_reason = "abort"
        stream.ready.set()

    # -- the step loop --------------------------------------------------------------

    async def _run(self, rank: Rank) -> None:
        try:
            await self._loop(rank)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in the mocker: fail every stream, report dead
            log.exception("mocker rank %d failed", rank.index)
            self._dead = f"mocker rank {rank.index} failed: {exc!r}"
            for stream in list(self._streams.values()):
                if stream.finish_reason is None:
                    stream.finish_reason = "error"
                    stream.error = self._dead
                    stream.ready.set()

    async def _loop(self, rank: Rank) -> None:
        loop = asyncio.get_running_loop()
        scheduler, blocks, timer = rank.scheduler, rank.blocks, self.timer
        kv_tokens = blocks.num_blocks * blocks.block_size
        # Simulated clock: when the previous step ended. Steps run back to back are laid
        # end to end on it, so the event loop's timer lateness (about 0.1–1 ms per sleep)
        # does not add up over a stream; after idling it restarts from now.
        clock = loop.time()
        while True:
            if not scheduler.has_work:
                rank.wake.clear()
                await rank.wake.wait()
                clock = loop.time()
            step = scheduler.schedule()
            if step.empty:
                if not step.preempted:  # nothing fits now; wait for a change
                    rank.wake.clear()
                    await rank.wake.wait()
                    clock = loop.time()
                continue
            shape = StepShape.of(step, kv_tokens)
            self._publish(rank)  # evictions made by this step's allocations
            now = loop.time()
            # Never owe more than MAX_CATCH_UP: a starved process should run slow, not
            # burst many steps at once.
            seconds = timer.step_seconds(shape)
            if step.loaded_host or step.loaded_disk:
                seconds += self.kv_copies.load_seconds(step.loaded_host, step.loaded_disk)
            clock = max(clock, now - MAX_CATCH_UP) + seconds
            # Sleep the step; at speedup 0 still yield so streams and arrivals get a turn.
            await asyncio.sleep(clock - now if clock > now else 0)
            for seq in scheduler.complete(step):
                self._emit(rank, seq)
            self._publish(rank)

    def _emit(self, rank: Rank, seq: Sequence) -> None:
        stream = self._streams.get(seq.request_id)
        if stream is None or stream.seq is not seq:
            rank.scheduler.abort(seq)
            return
        token = stream.plan.next_token()
        stream.produced = produced = seq.num_generated + 1
        reason, visible = stream.plan.finish(token, produced)
        if visible:
            stream.tokens.append(token)
        if reason is None:
            rank.scheduler.append_token(seq, token)
        else:
            rank.scheduler.finish(seq)
            stream.finish_reason = reason
            if reason == "stop":
                stream.stop_token_id = token
            if self.role == "prefill":
                stream.disagg = self._disagg_params(rank, seq)
        stream.ready.set()

    def _disagg_params(self, rank: Rank, seq: Sequence) -> DisaggParams:
        n = seq.num_prompt
        return DisaggParams(
            prefill_worker_id=self.worker_id,
            remote_block_ids=seq.block_hashes[: n // self.config.block_size],
            num_prompt_tokens=n,
            transfer={"dp_rank": rank.index, "kv_bytes": n * self.kv_bytes_per_token},
            # The mocker keeps nothing pinned: its blocks stay in the prefix cache.
            prefill_request_id=seq.request_id,
            block_size=self.config.block_size,
        )

    def _publish(self, rank: Rank) -> None:
        events = rank.blocks.drain_events()
        if not events:
            return
        if self._events.qsize() >= MAX_PENDING_EVENT_BATCHES:
            self._events.get_nowait()
        self._events.put_nowait(events)

    # -- state for the worker host --------------------------------------------------

    def model_card(self) -> ModelCard:
        if self.card.role != self.role:
            self.card = msgspec.structs.replace(self.card, role=self.role)
        return self.card

    def load(self) -> list[LoadReport]:
        return [
            LoadReport(
                worker_id=self.worker_id,
                dp_rank=rank.index,
                active_kv_blocks=rank.blocks.num_active_blocks,
                total_kv_blocks=rank.blocks.num_blocks,
                num_waiting=len(rank.scheduler.waiting),
                num_running=len(rank.scheduler.running),
                queued_prefill_tokens=rank.scheduler.queued_prefill_tokens(),
            )
            for rank in self.ranks
        ]

    async def kv_events(self) -> AsyncIterator[list[KvEvent]]:
        while True:
            yield await self._events.get()

    def kv_state(self) -> list[KvEvent]:
        return [event for rank in self.ranks for event in rank.blocks.kv_state()]

    async def clear_kv(self) -> None:
        for rank in self.ranks:
            rank.blocks.clear()
            self._publish(rank)

    def metrics(self) -> dict[str, float]:
        return {
            "mocker_requests_total": self.num_requests,
            "mocker_preemptions_total": sum(r.scheduler.num_preemptions for r in self.ranks),
            "preemptions_total": sum(r.scheduler.num_preemptions for r in self.ranks),
            "mocker_cached_blocks": sum(r.blocks.num_cached_blocks for r in self.ranks),
            "mocker_active_blocks": sum(r.blocks.num_active_blocks for r in self.ranks),
            "kv_transfers_total": self.num_transfers,
            "kv_transfer_bytes_total": self.transferred_tokens * self.kv_bytes_per_token,
            **self._tier_metrics(),
        }

    def _tier_metrics(self) -> dict[str, float]:
        tiers = [r.blocks.lower for r in self.ranks if r.blocks.lower is not None]
        if not tiers:
            return {}
        out: dict[str, float] = {}
        for tier in ("host", "disk"):
            out[f"kv_{tier}_hits"] = sum(t.hits[tier] for t in tiers)
            out[f"kv_{tier}_saved_blocks"] = sum(t.saved[tier] for t in tiers)
        out["kv_host_blocks"] = sum(len(t.host) for t in tiers)
        out["kv_disk_blocks"] = sum(len(t.disk) for t in tiers)
        return out
