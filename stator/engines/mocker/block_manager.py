"""The simulated KV cache: a fixed pool of blocks, reference counts and a prefix cache.

A block is either *free* (holds nothing), *partial* (held by one sequence, not yet full,
so it has no hash), *active* (full, hashed, held by one or more sequences) or *inactive*
(full and hashed, held by nobody, kept as reusable cache until evicted). Only counts are
kept for free and partial blocks: the mocker never needs to know which physical block holds
what, only how many there are and which hashes are cached.

Eviction takes inactive blocks in LRU order. A sequence releases its blocks tail first, so
within one release the deepest blocks are evicted first and shared prefixes survive longest.

Every change to the set of cached hashes becomes a KV event; consecutive stores along one
chain are merged into one `BlockStored`, so a 512-token prompt is one event, not eight.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from typing import NamedTuple

from stator.engines.mocker.tiers import LowerTiers
from stator.protocols import AllCleared, BlockRemoved, BlockStored, KvEvent, KvEventData


class _Cached(NamedTuple):
    parent: int | None
    tokens: list[int]
    depth: int


class NoFreeBlocks(Exception):
    """An allocation was asked for more blocks than the pool can give."""


class BlockManager:
    """Block pool with prefix cache. Pure bookkeeping: no I/O, no clock."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        enable_prefix_caching: bool = True,
        worker_id: int = 0,
        dp_rank: int = 0,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.worker_id = worker_id
        self.dp_rank = dp_rank
        self._free = num_blocks
        self._partial = 0
        self._active: dict[int, int] = {}  # hash -> reference count
        self._inactive: OrderedDict[int, None] = OrderedDict()  # first = evicted first
        self._cached: dict[int, _Cached] = {}  # every hash in active or inactive
        # Hashes still held by sequences after `clear()` forgot them: freed, not cached.
        self._orphans: Counter[int] = Counter()
        self._pending: list[KvEventData] = []
        self._next_event_id = 0
        # Host / disk tiers fed by evictions (`enable_tiers`); None: the GPU tier only.
        self.lower: LowerTiers | None = None

    def enable_tiers(self, host_blocks: int, disk_blocks: int) -> None:
        if host_blocks > 0 or disk_blocks > 0:
            self.lower = LowerTiers(host_blocks, disk_blocks, self.block_size, self._pending_add)

    def _pending_add(self, data: KvEventData) -> None:
        self._pending.append(data)

    # -- queries --------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now: free ones plus evictable cache."""
        return self._free + len(self._inactive)

    @property
    def num_active_blocks(self) -> int:
        """Blocks held by sequences (full and partial)."""
        return self.num_blocks - self._free - len(self._inactive)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def refcount(self, block_hash: int) -> int:
        return self._active.get(block_hash, 0)

    def is_cached(self, block_hash: int) -> bool:
        return block_hash in self._cached

    def inactive_hashes(self) -> list[int]:
        """Inactive hashes in eviction order (first is evicted first)."""
        return list(self._inactive)

    def match_prefix(self, hashes: list[int]) -> tuple[int, int]:
        """(leading blocks of `hashes` that are cached, how many of those are inactive)."""
        if not self.enable_prefix_caching:
            return 0, 0
        hits = inactive = 0
        for h in hashes:
            if h in self._active:
                hits += 1
            elif h in self._inactive:
                hits += 1
                inactive += 1
            else:
                break
        return hits, inactive

    # -- changes --------------------------------------------------------------------

    def acquire_cached(self, hashes: list[int]) -> None:
        """Take a reference on cached blocks (a prefix hit found by `match_prefix`)."""
        for h in hashes:
            count = self._active.get(h)
            if count is not None:
                self._active[h] = count + 1
            else:
                del self._inactive[h]  # KeyError here means the caller skipped match_prefix
                self._active[h] = 1

    def allocate(self, n: int) -> None:
        """Hand out `n` empty (partial) blocks, evicting cache when nothing is free."""
        if n > self.num_free_blocks:
            raise NoFreeBlocks(f"need {n} blocks, {self.num_free_blocks} free")
        from_free = min(n, self._free)
        self._free -= from_free
        for _ in range(n - from_free):
            self._evict_one()
        self._partial += n

    def commit(self, block_hash: int, parent: int | None, tokens: list[int]) -> None:
        """A held partial block just became full with `tokens`: cache it under its hash.

        When the hash is cached already (another sequence computed the same block), the
        sequence shares that block and its own copy goes back to the pool."""
        self._partial -= 1
        if not self.enable_prefix_caching:
            self._orphans[block_hash] += 1
            return
        count = self._active.get(block_hash)
        if count is not None:
            self._active[block_hash] = count + 1
            self._free += 1
            return
        if block_hash in self._inactive:
            del self._inactive[block_hash]
            self._active[block_hash] = 1
            self._free += 1
            return
        depth = (
            0 if parent is None else self._cached[parent].depth + 1 if parent in self._cached else 0
        )
        self._cached[block_hash] = _Cached(parent, tokens, depth)
        self._active[block_hash] = 1
        self._store_event(block_hash, parent, tokens)

    def release(self, hashes: list[int], num_partial: int) -> None:
        """A sequence lets go of its full blocks `hashes` (in sequence order) and of
        `num_partial` partial blocks."""
        self._partial -= num_partial
        self._free += num_partial
        for h in reversed(hashes):  # tail first: the deepest block is evicted first
            orphaned = self._orphans.get(h)
            if orphaned:
                if orphaned == 1:
                    del self._orphans[h]
                else:
                    self._orphans[h] = orphaned - 1
                self._free += 1
                continue
            count = self._active[h] - 1
            if count:
                self._active[h] = count
            else:
                del self._active[h]
                self._inactive[h] = None

    def clear(self) -> None:
        """Forget the whole prefix cache (blocks in use stay allocated but uncached)."""
        for h, count in self._active.items():
            self._orphans[h] += count
        self._free += len(self._inactive)
        self._active.clear()
        self._inactive.clear()
        self._cached.clear()
        if self.lower is not None:
            self.lower.clear()
        self._pending.append(AllCleared())

    # -- events ---------------------------------------------------------------------

    def drain_events(self) -> list[KvEvent]:
        """The events since the last drain, stamped with consecutive event ids."""
        if not self._pending:
            return []
        out = []
        for data in self._pending:
            out.append(
                KvEvent(
                    worker_id=self.worker_id,
                    event_id=self._next_event_id,
                    data=data,
                    dp_rank=self.dp_rank,
                )
            )
            self._next_event_id += 1
        self._pending = []
        return out

    def kv_state(self) -> list[KvEvent]:
        """Every cached block as a `BlockStored` event, parents before children. The
        events carry the id of the last event emitted, so a consumer knows which live
        events the snapshot already includes."""
        last = self._next_event_id - 1
        ordered = sorted(self._cached.items(), key=lambda item: item[1].depth)
        lower = self.lower.kv_state() if self.lower is not None else []
        return [
            KvEvent(worker_id=self.worker_id, event_id=last, dp_rank=self.dp_rank, data=data)
            for data in lower
        ] + [
            KvEvent(
                worker_id=self.worker_id,
                event_id=last,
                dp_rank=self.dp_rank,
                data=BlockStored(
                    block_hashes=[h],
                    parent_hash=info.parent,
                    token_ids=list(info.tokens),
                    block_size=self.block_size,
                ),
            )
            for h, info in ordered
        ]

    def _store_event(self, block_hash: int, parent: int | None, tokens: list[int]) -> None:
        last = self._pending[-1] if self._pending else None
        if (
            isinstance(last, BlockStored)
            and last.tier == "gpu"
            and parent is not None
            and last.block_hashes[-1] == parent
        ):
            last.block_hashes.append(block_hash)
            last.token_ids.extend(tokens)
            return
        self._pending.append(
            BlockStored(
                block_hashes=[block_hash],
                parent_hash=parent,
                token_ids=list(tokens),
                block_size=self.block_size,
            )
        )

    def _evict_one(self) -> None:
        h, _ = self._inactive.popitem(last=False)
        info = self._cached.pop(h)
        last = self._pending[-1] if self._pending else None
        if isinstance(last, BlockRemoved) and last.tier == "gpu":
            last.block_hashes.append(h)
        else:
            self._pending.append(BlockRemoved(block_hashes=[h]))
        if self.lower is not None:
            self.lower.offload(h, info.parent, info.tokens)
