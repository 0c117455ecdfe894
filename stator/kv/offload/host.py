"""The host tier: a pinned buffer of block slots with an LRU order over the blocks it holds.

Block-major ([slots, *block_shape], `stator.kv.block_copy`), so a block is one contiguous
slot and a run of adjacent slots is one copy. Slots are handed out lowest first, which keeps
the blocks of one eviction or one load in few runs.

Copies on the device's copy stream touch slots asynchronously: each slot keeps the event of
the last one, and the host waits on it before it reads or overwrites the slot itself
(`settle`), which in LRU order is almost never still pending.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class BlockMeta:
    """What a tier keeps besides the data: enough to describe the block in a KV event."""

    parent_hash: int | None
    token_ids: tuple[int, ...]
    lora_name: str | None = None


class HostTier:
    def __init__(
        self, num_slots: int, block_shape: tuple[int, ...], dtype: torch.dtype, pin: bool
    ) -> None:
        if num_slots < 1:
            raise ValueError("the host tier needs at least one block slot")
        self.buffer = torch.empty((num_slots, *block_shape), dtype=dtype, pin_memory=pin)
        self._free = list(range(num_slots))  # a heap: lowest slot first
        self._lru: OrderedDict[int, int] = OrderedDict()  # block hash -> slot, oldest first
        self.meta: dict[int, BlockMeta] = {}
        self._events: dict[int, torch.cuda.Event] = {}  # slot -> last async copy

    @property
    def num_slots(self) -> int:
        return self.buffer.shape[0]

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._lru

    def hashes(self) -> list[int]:
        return list(self._lru)

    def slot(self, block_hash: int) -> int:
        return self._lru[block_hash]

    def touch(self, block_hash: int) -> None:
        self._lru.move_to_end(block_hash)

    def take(self, n: int) -> tuple[list[int], list[tuple[int, int, BlockMeta]]]:
        """`n` free slots, evicting the least recently used blocks as needed; returns the
        slots and the evicted (hash, slot, meta), whose data the caller may still read
        (and must, before it writes the slot) to demote it."""
        n = min(n, self.num_slots)
        evicted = []
        while len(self._free) < n:
            h, s = self._lru.popitem(last=False)
            evicted.append((h, s, self.meta.pop(h)))
            heapq.heappush(self._free, s)
        slots = sorted(heapq.heappop(self._free) for _ in range(n))
        return slots, evicted

    def put(self, block_hash: int, slot: int, meta: BlockMeta) -> None:
        self._lru[block_hash] = slot
        self.meta[block_hash] = meta

    def give_back(self, slots: list[int]) -> None:
        """Slots taken but not used."""
        for s in slots:
            heapq.heappush(self._free, s)

    def remove(self, block_hash: int) -> None:
        slot = self._lru.pop(block_hash, None)
        if slot is not None:
            self.meta.pop(block_hash, None)
            heapq.heappush(self._free, slot)

    def clear(self) -> None:
        for h in list(self._lru):
            self.remove(h)

    # -- async copies ------------------------------------------------------------------

    def mark(self, slots: list[int], event: torch.cuda.Event | None) -> None:
        if event is not None:
            for s in slots:
                self._events[s] = event

    def settle(self, slots: list[int]) -> None:
        """Wait for the async copies that last touched these slots."""
        for s in slots:
            event = self._events.pop(s, None)
            if event is not None:
                event.synchronize()
