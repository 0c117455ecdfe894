"""`KvIndex`: which workers hold which KV blocks, and how long a prompt's cached prefix
is on each of them.

The blocks are keyed by their *sequence* hash (`stator.kv.hashing`), which names the whole
prefix up to and including the block; so the index needs no tree: a flat dict from
sequence hash to the set of holders answers "does worker w hold the first i blocks of
this prompt" block by block. The holder set is a Python int used as a bitmask (one bit
per (worker, dp_rank) slot): storing a block is one dict update and an OR, a lookup walks
the prompt's hashes ANDing masks and stops as soon as no holder is left. Measured in
`benchmarks/kv_index.py` (several million block events/s, tens of thousands of 4k-token
lookups/s on one core).

Lower tiers: an engine that keeps evicted blocks in host memory or on disk says so with the
event's `tier`. Those blocks live in maps of their own (the GPU map, and every lookup on a
fleet without tiers, stay as they were); `find_weighted` walks all three and counts a block
in a lower tier as a fraction of a GPU block (the router's `--kv-host-overlap-weight`,
`--kv-disk-overlap-weight`), the engine's cost of loading it instead of computing it.

Engines with their own block hashes (vLLM) send the blocks' token ids: the index
recomputes our hashes from the tokens and keeps, per worker, engine hash -> our hash so
that later removals (which carry only engine hashes) can be applied.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat

from stator.kv.hashing import block_hashes
from stator.protocols import AllCleared, BlockRemoved, BlockStored, KvEventData

log = logging.getLogger(__name__)

# A KV cache holder: (worker instance id, data-parallel rank).
WorkerKey = tuple[int, int]
LOWER_TIERS = ("host", "disk")


class _Slot:
    """One holder's bookkeeping: its bit, its blocks, and (for engines with foreign
    hashes) the engine-hash -> our-hash map."""

    __slots__ = ("bit", "blocks", "foreign", "lower", "native")

    def __init__(self, bit: int) -> None:
        self.bit = bit
        self.blocks: set[int] = set()
        self.lower: dict[str, set[int]] = {t: set() for t in LOWER_TIERS}
        # None until the first stored event with token ids tells whether the engine
        # hashes blocks the way we do.
        self.native: bool | None = None
        self.foreign: dict[int, int] = {}


class KvIndex:
    def __init__(self, block_size: int, jump: int = 1) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if jump < 1:
            raise ValueError(f"jump must be >= 1, got {jump}")
        self.block_size = block_size
        self.jump = jump
        self._owners: dict[int, int] = {}  # sequence hash -> bitmask of slots (GPU tier)
        self._lower: dict[str, dict[int, int]] = {t: {} for t in LOWER_TIERS}
        self._slots: dict[WorkerKey, _Slot] = {}
        self._by_bit: dict[int, WorkerKey] = {}
        self._free_bits: list[int] = []
        self._next_bit = 0

    # -- holders ---------------------------------------------------------------------

    def _slot(self, key: WorkerKey) -> _Slot:
        slot = self._slots.get(key)
        if slot is None:
            if self._free_bits:
                index = self._free_bits.pop()
            else:
                index = self._next_bit
                self._next_bit += 1
            slot = self._slots[key] = _Slot(1 << index)
            self._by_bit[index] = key
        return slot

    def workers(self) -> list[WorkerKey]:
        return list(self._slots)

    def tree_size(self, key: WorkerKey) -> int:
        """How many blocks `key` holds."""
        slot = self._slots.get(key)
        return len(slot.blocks) if slot is not None else 0

    def num_blocks(self) -> int:
        """Distinct blocks held by anyone."""
        return len(self._owners)

    def holders(self, block_hash: int) -> list[WorkerKey]:
        return self._keys_of(self._owners.get(block_hash, 0))

    def _keys_of(self, mask: int) -> list[WorkerKey]:
        keys = []
        while mask:
            low = mask & -mask
            keys.append(self._by_bit[low.bit_length() - 1])
            mask ^= low
        return keys

    # -- events ----------------------------------------------------------------------

    def apply(self, key: WorkerKey, data: KvEventData) -> None:
        if isinstance(data, BlockStored):
            self.store_event(key, data)
        elif isinstance(data, BlockRemoved):
            self.remove_event(key, data.block_hashes, data.tier)
        elif isinstance(data, AllCleared):
            self.clear(key)

    def store(self, key: WorkerKey, hashes: Iterable[int], tier: str = "gpu") -> None:
        """Record that `key` holds blocks with these (our) sequence hashes in `tier`."""
        slot = self._slot(key)
        bit = slot.bit
        owners, blocks = self._tier_maps(slot, tier)
        if owners is None:
            return
        get = owners.get
        hashes = hashes if isinstance(hashes, list) else list(hashes)
        for h in hashes:
            owners[h] = get(h, 0) | bit
        blocks.update(hashes)

    def _tier_maps(self, slot: _Slot, tier: str) -> tuple[dict[int, int] | None, set[int]]:
        if tier == "gpu":
            return self._owners, slot.blocks
        if tier in self._lower:
            return self._lower[tier], slot.lower[tier]
        return None, set()  # a tier this router does not know: ignored

    def store_event(self, key: WorkerKey, event: BlockStored) -> None:
        slot = self._slot(key)
        tier = event.tier
        if not event.token_ids:
            # No tokens: the engine can only be using our hashes.
            self.store(key, event.block_hashes, tier)
            return
        if event.block_size != self.block_size:
            log.warning(
                "worker %x sent blocks of %d tokens, the router uses %d: ignored",
                key[0],
                event.block_size,
                self.block_size,
            )
            return
        if slot.native is None:
            slot.native = self._hashes_like_ours(event)
        if slot.native:
            self.store(key, event.block_hashes, tier)
            return
        parent = None
        if event.parent_hash is not None:
            parent = slot.foreign.get(event.parent_hash)
            if parent is None:
                # The parent was never seen (or already removed): these blocks cannot
                # extend any prefix we know, so they could never match a lookup.
                return
        ours = block_hashes(
            event.token_ids, self.block_size, parent=parent, lora_name=event.lora_name
        )
        slot.foreign.update(zip(event.block_hashes, ours, strict=False))
        self.store(key, ours, tier)

    def _hashes_like_ours(self, event: BlockStored) -> bool:
        first = event.token_ids[: self.block_size]
        if len(first) < self.block_size or not event.block_hashes:
            return True
        ours = block_hashes(
            first, self.block_size, parent=event.parent_hash, lora_name=event.lora_name
        )
        return ours[0] == event.block_hashes[0]

    def remove(self, key: WorkerKey, hashes: Iterable[int], tier: str = "gpu") -> None:
        """Record that `key` no longer holds these (our) sequence hashes in `tier`."""
        slot = self._slots.get(key)
        if slot is None:
            return
        keep = ~slot.bit
        owners, blocks = self._tier_maps(slot, tier)
        if owners is None:
            return
        for h in hashes:
            if h in blocks:
                blocks.discard(h)
                mask = owners[h] & keep
                if mask:
                    owners[h] = mask
                else:
                    del owners[h]

    def remove_event(self, key: WorkerKey, engine_hashes: Sequence[int], tier: str = "gpu") -> None:
        slot = self._slots.get(key)
        if slot is None:
            return
        if slot.native is False:
            # The GPU tier's removal ends the mapping; a lower tier's leaves it for the others.
            find = slot.foreign.pop if tier == "gpu" else slot.foreign.get
            engine_hashes = [o for o in (find(h, None) for h in engine_hashes) if o is not None]
        self.remove(key, engine_hashes, tier)

    def clear(self, key: WorkerKey) -> None:
        """Drop every block of `key` (AllCleared, or before a full resync)."""
        slot = self._slots.get(key)
        if slot is None:
            return
        self.remove(key, list(slot.blocks))
        for tier in LOWER_TIERS:
            self.remove(key, list(slot.lower[tier]), tier)
        slot.foreign.clear()

    def remove_worker(self, worker_id: int) -> None:
        """Forget every dp rank of a worker that left the fleet."""
        for key in [k for k in self._slots if k[0] == worker_id]:
            self.clear(key)
            slot = self._slots.pop(key)
            index = slot.bit.bit_length() - 1
            del self._by_bit[index]
            self._free_bits.append(index)

    # -- lookup ----------------------------------------------------------------------

    def find_matches(self, hashes: Sequence[int]) -> dict[WorkerKey, int]:
        """For each holder of the prompt's first block: how many leading blocks of
        `hashes` (the prompt's sequence hashes) it holds."""
        if not hashes:
            return {}
        get = self._owners.get
        alive = get(hashes[0], 0)
        if not alive:
            return {}
        depths: dict[WorkerKey, int] = {}
        n = len(hashes)
        jump = self.jump
        if jump == 1:
            return self._walk(hashes, alive, depths)
        pos = 0  # every worker in `alive` holds blocks 0..pos
        while pos < n - 1:
            end = min(pos + jump, n - 1)
            if jump > 1 and alive & get(hashes[end], 0) == alive:
                pos = end  # nobody dropped out at the end of the stride: skip it
                continue
            for i in range(pos + 1, end + 1):
                still = alive & get(hashes[i], 0)
                if still != alive:
                    self._record(alive ^ still, i, depths)
                    if not still:
                        return depths
                    alive = still
            pos = end
        self._record(alive, n, depths)
        return depths

    def has_lower_tiers(self) -> bool:
        return any(self._lower.values())

    def find_weighted(
        self, hashes: Sequence[int], weights: Mapping[str, float]
    ) -> dict[WorkerKey, float]:
        """Like `find_matches`, with the prefix continuing through lower tiers: each
        leading block counts 1 on the GPU, `weights["host"]` in host memory and
        `weights["disk"]` on disk (its best tier), up to the first block held nowhere."""
        if not self.has_lower_tiers():
            return dict(self.find_matches(hashes))
        gpu, host, disk = self._owners.get, self._lower["host"].get, self._lower["disk"].get
        wh, wd = weights.get("host", 0.0), weights.get("disk", 0.0)
        scores: dict[int, float] = {}
        alive = -1
        for h in hashes:
            mg, mh, md = gpu(h, 0), host(h, 0), disk(h, 0)
            alive &= mg | mh | md
            if not alive:
                break
            for mask, w in (
                (alive & mg, 1.0),
                (alive & mh & ~mg, wh),
                (alive & md & ~mg & ~mh, wd),
            ):
                while mask:
                    low = mask & -mask
                    scores[low] = scores.get(low, 0.0) + w
                    mask ^= low
        return {self._by_bit[low.bit_length() - 1]: v for low, v in scores.items()}

    def _walk(
        self, hashes: Sequence[int], alive: int, depths: dict[WorkerKey, int]
    ) -> dict[WorkerKey, int]:
        """The exact walk: every block is checked."""
        depth = 1
        for mask in map(self._owners.get, hashes[1:], repeat(0)):
            still = alive & mask
            if still != alive:
                self._record(alive ^ still, depth, depths)
                if not still:
                    return depths
                alive = still
            depth += 1
        self._record(alive, depth, depths)
        return depths

    def _record(self, mask: int, depth: int, depths: dict[WorkerKey, int]) -> None:
        by_bit = self._by_bit
        while mask:
            low = mask & -mask
            depths[by_bit[low.bit_length() - 1]] = depth
            mask ^= low
