"""`OffloadManager`: the host and disk tiers behind an engine's paged KV pool.

The engine's block manager hands over the cached blocks it evicts (`save`: gathered on the
compute stream before anything can overwrite them, copied to pinned host slots on the copy
stream, so the step never waits for the bus) and asks, when it admits a prompt, how many of
the prompt's next blocks a lower tier holds (`match`). If the load policy says loading beats
recomputing, it allocates GPU blocks for them and the manager copies them back (`load`:
disk blocks are first read into host slots, then every block goes up in one gather-copy-
scatter). The blocks stay referenced by the load until its event has fired (`poll`), and a
step whose sequences read them waits for it on the device (`wait_for`), not on the host.

Tiers are LRU each. A block leaving the host tier is written to the disk tier (when there
is one); disk keeps its copy when a block is promoted back to host. Every change is a KV
event with its tier, so the router can count a host or disk hit as worth less than a GPU
hit and more than a miss.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from stator.kv.block_copy import BlockMover, block_bytes, block_shape
from stator.kv.offload.disk import DiskTier
from stator.kv.offload.host import BlockMeta, HostTier
from stator.kv.offload.policy import LoadPolicy
from stator.protocols import BlockRemoved, BlockStored, KvEventData

log = logging.getLogger(__name__)

GiB = 1 << 30


@dataclass(frozen=True, slots=True)
class EvictedBlock:
    block_hash: int
    parent_hash: int | None
    token_ids: tuple[int, ...]
    block_id: int
    lora_name: str | None = None


@dataclass
class TierStats:
    """Counters per tier ("host", "disk"), for the worker's metrics."""

    blocks_saved: dict[str, int] = field(default_factory=lambda: {"host": 0, "disk": 0})
    blocks_loaded: dict[str, int] = field(default_factory=lambda: {"host": 0, "disk": 0})
    lookups: int = 0  # prompts that reached the lower tiers
    hits: dict[str, int] = field(default_factory=lambda: {"host": 0, "disk": 0})
    blocks_dropped: int = 0  # evicted but not saved (more in one step than the staging cap)
    recomputed_blocks: int = 0  # found below but recomputed (faster than loading)
    load_seconds: float = 0.0
    bytes_loaded: int = 0


@dataclass
class _Load:
    done: torch.cuda.Event | None
    start: torch.cuda.Event | None
    block_ids: list[int]
    nbytes: int


class OffloadManager:
    def __init__(
        self,
        pool: torch.Tensor,
        *,
        block_size: int,
        host_bytes: int,
        disk_dir: str | Path | None = None,
        disk_bytes: int = 0,
        policy: str = "auto",
        layout_id: str = "",
        emit: Callable[[KvEventData], None],
        max_save_bytes: int = GiB,
    ) -> None:
        self.block_size = block_size
        self.block_bytes = block_bytes(pool)
        self.mover = BlockMover(pool)
        slots = host_bytes // self.block_bytes
        if slots < 1:
            raise ValueError(
                f"--kv-offloading-size holds no block ({self.block_bytes} bytes each); "
                "the disk tier also needs a host tier to stage through"
            )
        self.host = HostTier(slots, block_shape(pool), pool.dtype, pin=pool.is_cuda)
        self.disk: DiskTier | None = None
        if disk_dir and disk_bytes:
            layout = {
                "block_shape": list(block_shape(pool)),
                "dtype": str(pool.dtype),
                "block_size": block_size,
                "model": layout_id,
            }
            self.disk = DiskTier(disk_dir, disk_bytes // self.block_bytes, self.block_bytes, layout)
        self.policy = LoadPolicy(policy, self.block_bytes, block_size)
        self.max_save_blocks = max(1, max_save_bytes // self.block_bytes)
        self._emit = emit
        self.stats = TierStats()
        self._inflight: list[_Load] = []
        self._timed = pool.is_cuda

    # -- device -> host ----------------------------------------------------------------

    def save(self, evicted: Sequence[EvictedBlock]) -> None:
        """Keep blocks the GPU tier just evicted. Call before the step that reuses them
        is enqueued: the gather is ordered before their new contents."""
        fresh = []
        for b in evicted:
            if b.block_hash in self.host:
                self.host.touch(b.block_hash)
            else:
                fresh.append(b)
        limit = min(self.max_save_blocks, self.host.num_slots)
        if len(fresh) > limit:
            self.stats.blocks_dropped += len(fresh) - limit
            fresh = fresh[:limit]  # the first ones: the LRU's oldest order is kept below
        if not fresh:
            return
        slots, demoted = self.host.take(len(fresh))
        self._demote(demoted)
        self.host.settle(slots)  # a disk read may still be writing one on the host
        event = self.mover.save([b.block_id for b in fresh], self.host.buffer, slots)
        self.host.mark(slots, event)
        for b, slot in zip(fresh, slots, strict=True):
            self.host.put(b.block_hash, slot, BlockMeta(b.parent_hash, b.token_ids, b.lora_name))
        self.stats.blocks_saved["host"] += len(fresh)
        self._announce("host", [b.block_hash for b in fresh], self.host.meta)

    def _demote(self, demoted: list[tuple[int, int, BlockMeta]]) -> None:
        """Blocks pushed out of the host tier: to disk, when there is one."""
        if not demoted:
            return
        self._emit(BlockRemoved(block_hashes=[h for h, _, _ in demoted], tier="host"))
        if self.disk is None:
            return
        stored = []
        for h, slot, meta in demoted:
            if h in self.disk:
                self.disk.touch(h)
                continue
            self.host.settle([slot])
            data = self.host.buffer[slot].reshape(-1).view(torch.uint8).numpy().copy()
            removed = self.disk.put(h, meta, data)
            if removed:
                self._emit(BlockRemoved(block_hashes=removed, tier="disk"))
            stored.append(h)
        stored = [h for h in stored if h in self.disk]  # a small tier may have dropped some
        self.stats.blocks_saved["disk"] += len(stored)
        self._announce("disk", stored, self.disk.meta)

    # -- lower tiers -> device ---------------------------------------------------------

    def match(self, hashes: Sequence[int]) -> tuple[int, int]:
        """How many leading `hashes` a lower tier holds, and how many of those only on
        disk. At most as many as the host tier has slots (loads stage through it)."""
        n = disk_only = 0
        for h in hashes[: self.host.num_slots]:
            if h in self.host:
                pass
            elif self.disk is not None and h in self.disk:
                disk_only += 1
            else:
                break
            n += 1
        self.stats.lookups += 1
        return n, disk_only

    def should_load(self, blocks: int, disk_only: int) -> bool:
        if self.policy.should_load(blocks - disk_only, disk_only):
            return True
        self.stats.recomputed_blocks += blocks
        return False

    def load(self, hashes: Sequence[int], block_ids: Sequence[int]) -> list[int]:
        """Copy these blocks (found by `match`) into the pool's `block_ids`. Returns the
        block ids whose copy is already done (all of them on the CPU); the others come
        back from `poll` once their copy has finished."""
        for h in hashes:  # most recent: a promotion below must not push them out
            if h in self.host:
                self.host.touch(h)
        from_disk = [h for h in hashes if h not in self.host]
        if from_disk:
            self._promote(from_disk)
        slots = [self.host.slot(h) for h in hashes]
        self.stats.hits["host"] += len(hashes) - len(from_disk)
        self.stats.hits["disk"] += len(from_disk)
        self.stats.blocks_loaded["host"] += len(hashes) - len(from_disk)
        self.stats.blocks_loaded["disk"] += len(from_disk)
        nbytes = len(hashes) * self.block_bytes
        if not self._timed:
            t0 = time.perf_counter()
            self.mover.load(self.host.buffer, slots, block_ids)
            self._observe(nbytes, time.perf_counter() - t0)
            return list(block_ids)
        start = torch.cuda.Event(enable_timing=True)
        done = self.mover.load(self.host.buffer, slots, block_ids, start=start)
        self.host.mark(slots, done)
        self._inflight.append(_Load(done, start, list(block_ids), nbytes))
        return []

    def _promote(self, hashes: list[int]) -> None:
        """Read disk blocks into host slots (synchronously, in a few ms per block)."""
        assert self.disk is not None
        slots, demoted = self.host.take(len(hashes))
        self._demote(demoted)
        self.host.settle(slots)
        t0 = time.perf_counter()
        for h, slot in zip(hashes, slots, strict=True):
            meta = self.disk.meta[h]
            self.disk.read_into(h, self.host.buffer[slot].reshape(-1).view(torch.uint8).numpy())
            self.disk.touch(h)
            self.host.put(h, slot, meta)
        self.policy.observe_disk_read(len(hashes) * self.block_bytes, time.perf_counter() - t0)
        self._announce("host", hashes, self.host.meta)

    def poll(self) -> list[int]:
        """Block ids whose load has finished since the last call."""
        finished: list[int] = []
        keep = []
        for load in self._inflight:
            if load.done is None or load.done.query():
                finished.extend(load.block_ids)
                if load.start is not None and load.done is not None:
                    self._observe(load.nbytes, load.start.elapsed_time(load.done) / 1e3)
            else:
                keep.append(load)
        self._inflight = keep
        return finished

    def copying(self) -> bool:
        """Whether a load is still in flight (its blocks not yet given back)."""
        return bool(self._inflight)

    def wait_for(self, block_ids: Iterable[int]) -> None:
        """Make the device wait for loads into any of these blocks (a step about to read
        them); no host wait."""
        if not self._inflight:
            return
        wanted = set(block_ids)
        for load in self._inflight:
            if not wanted.isdisjoint(load.block_ids):
                self.mover.wait(load.done)

    def _observe(self, nbytes: int, seconds: float) -> None:
        self.policy.observe_host_copy(nbytes, seconds)
        self.stats.load_seconds += seconds
        self.stats.bytes_loaded += nbytes

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        self.policy.observe_prefill(tokens, seconds)

    # -- whole-cache operations --------------------------------------------------------

    def kv_state(self) -> list[BlockStored]:
        """Every lower-tier block as a `BlockStored`, parents before children per tier."""
        out: list[BlockStored] = []
        tiers = [("host", self.host.hashes(), self.host.meta)]
        if self.disk is not None:
            tiers.append(("disk", self.disk.hashes(), self.disk.meta))
        for tier, hashes, metas in tiers:
            for h in _parents_first(hashes, metas):
                out.append(self._stored(tier, [h], metas))
        return out

    def clear(self) -> None:
        self.settle()
        self.host.clear()
        if self.disk is not None:
            self.disk.clear()

    def settle(self) -> None:
        """Wait for every copy in flight."""
        for load in self._inflight:
            if load.done is not None:
                load.done.synchronize()
        if self.mover.stream is not None:
            self.mover.stream.synchronize()

    def close(self) -> None:
        """Give back the pinned memory; with a disk tier, write the host tier's blocks to
        it first, so that a restarted worker finds them (the GPU tier's are not kept)."""
        self.settle()
        s = self.stats
        log.info(
            "KV tiers: %d blocks saved to host, %d to disk; %d loaded from host, %d from "
            "disk (%.3f GiB in %.3f s: %.1f GB/s copy-back); %d recomputed, %d dropped",
            s.blocks_saved["host"],
            s.blocks_saved["disk"],
            s.blocks_loaded["host"],
            s.blocks_loaded["disk"],
            s.bytes_loaded / GiB,
            s.load_seconds,
            s.bytes_loaded / s.load_seconds / 1e9 if s.load_seconds else 0.0,
            s.recomputed_blocks,
            s.blocks_dropped,
        )
        if self.disk is not None:
            hashes = self.host.hashes()
            self._demote([(h, self.host.slot(h), self.host.meta[h]) for h in hashes])
            self.host.clear()
            self.disk.flush()
            self.disk.close()
        self.host.buffer = torch.empty(0)  # the pinned memory goes back now

    def metrics(self) -> dict[str, float]:
        s = self.stats
        out: dict[str, float] = {
            "kv_host_blocks": len(self.host),
            "kv_host_capacity_blocks": self.host.num_slots,
            "kv_offload_dropped_blocks": s.blocks_dropped,
            "kv_offload_recomputed_blocks": s.recomputed_blocks,
            "kv_offload_lookups": s.lookups,
            "kv_load_seconds": s.load_seconds,
            "kv_load_bytes": s.bytes_loaded,
        }
        if self.disk is not None:
            out["kv_disk_blocks"] = len(self.disk)
            out["kv_disk_capacity_blocks"] = self.disk.capacity
        for tier in ("host", "disk") if self.disk is not None else ("host",):
            out[f"kv_{tier}_saved_blocks"] = s.blocks_saved[tier]
            out[f"kv_{tier}_saved_bytes"] = s.blocks_saved[tier] * self.block_bytes
            out[f"kv_{tier}_loaded_blocks"] = s.blocks_loaded[tier]
            out[f"kv_{tier}_loaded_bytes"] = s.blocks_loaded[tier] * self.block_bytes
            out[f"kv_{tier}_hits"] = s.hits[tier]
        if self.policy.host_bandwidth:
            out["kv_load_bandwidth_bytes_per_s"] = self.policy.host_bandwidth
        return out

    # -- events --------------------------------------------------------------------------

    def _stored(self, tier: str, hashes: list[int], metas: dict[int, BlockMeta]) -> BlockStored:
        tokens: list[int] = []
        for h in hashes:
            tokens.extend(metas[h].token_ids)
        return BlockStored(
            block_hashes=hashes,
            parent_hash=metas[hashes[0]].parent_hash,
            token_ids=tokens,
            block_size=self.block_size,
            lora_name=metas[hashes[0]].lora_name,
            tier=tier,
        )

    def _announce(self, tier: str, hashes: list[int], metas: dict[int, BlockMeta]) -> None:
        """`BlockStored` events for `hashes`, one per chain of parent -> child."""
        chain: list[int] = []
        for h in hashes:
            meta = metas[h]
            if chain and (
                meta.parent_hash != chain[-1] or meta.lora_name != metas[chain[0]].lora_name
            ):
                self._emit(self._stored(tier, chain, metas))
                chain = []
            chain.append(h)
        if chain:
            self._emit(self._stored(tier, chain, metas))


def _parents_first(hashes: list[int], metas: dict[int, BlockMeta]) -> list[int]:
    present = set(hashes)
    done: set[int] = set()
    out: list[int] = []
    for h in hashes:
        chain = []
        cur: int | None = h
        while cur is not None and cur in present and cur not in done:
            chain.append(cur)
            cur = metas[cur].parent_hash
        for link in reversed(chain):
            done.add(link)
            out.append(link)
    return out
