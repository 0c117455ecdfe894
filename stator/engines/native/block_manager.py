"""The paged KV cache's bookkeeping: a pool of fixed-size blocks with reference counts,
a prefix cache (chained block hash -> block) and the KV events that describe it.

Free blocks sit in an LRU queue. A freed block keeps its cached KV until the queue reaches
it again, so a later request with the same prefix can take it back (a cache hit); reusing
it for other tokens evicts it (a `BlockRemoved` event). Only full blocks are hashed, with
`stator.kv.hashing`, so the router's index means the same thing as this cache.

With lower tiers (`offload`, `stator.kv.offload`), evicted cached blocks are listed in
`evicted` for the engine to save, and `admit` extends a prompt's GPU hit with the blocks a
lower tier holds when loading them beats recomputing: they get fresh blocks, counted as
computed, listed in `loads` for the engine to copy back, and held by one extra reference
until that copy is done (`release`), so nothing can reuse them while it runs.
"""

from __future__ import annotations

from collections import OrderedDict

from stator.engines.native.request import Sequence
from stator.kv.hashing import block_hashes
from stator.kv.offload import EvictedBlock, OffloadManager
from stator.protocols import AllCleared, BlockRemoved, BlockStored, KvEvent, KvEventData


class Block:
    __slots__ = ("hash", "id", "lora_name", "parent_hash", "ref_count", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.id = block_id
        self.ref_count = 0
        self.hash: int | None = None  # set while the block is in the prefix cache
        self.parent_hash: int | None = None
        self.token_ids: list[int] = []
        self.lora_name: str | None = None


class BlockManager:
    def __init__(
        self, num_blocks: int, block_size: int, *, prefix_caching: bool = True, worker_id: int = 0
    ) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.worker_id = worker_id
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}  # sequence hash -> block id
        self._events: list[KvEvent] = []
        self._next_event_id = 0
        self.offload: OffloadManager | None = None
        self.evicted: list[EvictedBlock] = []  # since the engine last took them
        self.loads: list[tuple[list[int], list[int]]] = []  # (hashes, block ids) to copy in

    # -- sizes ---------------------------------------------------------------------------

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return len(self.blocks) - len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- per-sequence operations (used by the scheduler) ---------------------------------

    def admit(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Give a waiting sequence its cached prefix plus blocks for `num_new_tokens`
        more; False (and no change) when the free blocks do not suffice."""
        hits: list[int] = []
        if self._cacheable(seq) and not seq.wants_prompt_logprobs:
            self._hash_full_blocks(seq)
            # Never the whole sequence: its last token must be computed to sample from.
            limit = (seq.num_tokens - 1) // self.block_size
            for h in seq.block_hashes[:limit]:
                block_id = self._cached.get(h)
                if block_id is None:
                    break
                hits.append(block_id)
            lower = self._lower_hits(seq.block_hashes[len(hits) : limit])
        else:
            lower = []
        cached_tokens = (len(hits) + len(lower)) * self.block_size
        num_new_tokens = min(num_new_tokens, seq.num_tokens - cached_tokens)
        need = self.blocks_for(cached_tokens + num_new_tokens) - len(hits)
        reusable = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        if need > self.num_free_blocks - reusable:
            return False
        for block_id in hits:
            self._acquire(block_id)
        seq.block_ids = hits + [self._allocate() for _ in range(need)]
        if lower:
            self._queue_load(seq, len(hits), lower)
        seq.num_computed_tokens = cached_tokens
        seq.num_committed_blocks = len(hits) + len(lower)
        if seq.num_cached_tokens is None:
            seq.num_cached_tokens = cached_tokens
        return True

    def grow(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make room for `num_new_tokens` more tokens of a running sequence."""
        need = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_ids)
        if need > self.num_free_blocks:
            return False
        seq.block_ids.extend(self._allocate() for _ in range(need))
        return True

    def free(self, seq: Sequence) -> None:
        """Release a sequence's blocks (finished, aborted or preempted)."""
        # Tail first: the LRU queue then evicts a prefix's last blocks before its first.
        for block_id in reversed(seq.block_ids):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None
        seq.block_ids = []
        seq.num_committed_blocks = 0

    def commit(self, seq: Sequence) -> None:
        """Offer the sequence's newly completed blocks to the prefix cache."""
        if not self._cacheable(seq):
            return
        full = seq.num_computed_tokens // self.block_size
        if full <= seq.num_committed_blocks:
            return
        self._hash_full_blocks(seq, upto=full)
        first = seq.num_committed_blocks
        parent = seq.block_hashes[first - 1] if first else None
        stored: list[int] = []
        tokens: list[int] = []
        for i in range(first, full):
            h, block = seq.block_hashes[i], self.blocks[seq.block_ids[i]]
            if h in self._cached or block.hash is not None:
                if stored:  # keep each event a contiguous chain
                    self._emit(
                        BlockStored(
                            block_hashes=stored,
                            parent_hash=parent,
                            token_ids=tokens,
                            block_size=self.block_size,
                            lora_name=seq.lora_name,
                        )
                    )
                stored, tokens, parent = [], [], h
                continue
            block.hash, block.parent_hash = h, (seq.block_hashes[i - 1] if i else None)
            block.token_ids = seq.token_ids[i * self.block_size : (i + 1) * self.block_size]
            block.lora_name = seq.lora_name
            self._cached[h] = block.id
            stored.append(h)
            tokens.extend(block.token_ids)
        if stored:
            self._emit(
                BlockStored(
                    block_hashes=stored,
                    parent_hash=parent,
                    token_ids=tokens,
                    block_size=self.block_size,
                    lora_name=seq.lora_name,
                )
            )
        seq.num_committed_blocks = full

    def release(self, block_ids: list[int]) -> None:
        """The copies into these blocks are done: drop the loads' references."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None

    def _lower_hits(self, hashes: list[int]) -> list[int]:
        """The leading `hashes` worth loading from a lower tier."""
        if self.offload is None or not hashes:
            return []
        n, disk_only = self.offload.match(hashes)
        if n and self.offload.should_load(n, disk_only):
            return hashes[:n]
        return []

    def _queue_load(self, seq: Sequence, first: int, hashes: list[int]) -> None:
        """Blocks first.. of `seq` will receive `hashes` from a lower tier: cache them now
        (other prompts may share them at once) and hold them until the copy is done."""
        ids = seq.block_ids[first : first + len(hashes)]
        stored: list[int] = []
        for i, (h, block_id) in enumerate(zip(hashes, ids, strict=True)):
            block = self.blocks[block_id]
            block.ref_count += 1  # the load's reference
            index = first + i
            if h in self._cached:
                continue  # a copy already cached elsewhere (a hole in the GPU prefix)
            block.hash = h
            block.parent_hash = seq.block_hashes[index - 1] if index else None
            block.lora_name = seq.lora_name
            bs = self.block_size
            block.token_ids = seq.token_ids[index * bs : (index + 1) * bs]
            self._cached[h] = block_id
            stored.append(h)
        if stored:
            self._emit_chain(stored)
        self.loads.append((list(hashes), list(ids)))
        seq.loading = True

    def _emit_chain(self, hashes: list[int]) -> None:
        tokens: list[int] = []
        for h in hashes:
            tokens.extend(self.blocks[self._cached[h]].token_ids)
        first = self.blocks[self._cached[hashes[0]]]
        self._emit(
            BlockStored(
                block_hashes=hashes,
                parent_hash=first.parent_hash,
                token_ids=tokens,
                block_size=self.block_size,
                lora_name=first.lora_name,
            )
        )

    # -- cache-wide operations -----------------------------------------------------------

    def clear(self) -> None:
        """Forget every cached prefix (blocks in use stay allocated, uncached)."""
        for block in self.blocks:
            block.hash, block.parent_hash, block.token_ids = None, None, []
        self._cached.clear()
        self.evicted.clear()
        if self.offload is not None:
            self.offload.clear()
        self._emit(AllCleared())

    def drain_events(self) -> list[KvEvent]:
        events, self._events = self._events, []
        return events

    def kv_state(self) -> list[KvEvent]:
        """The whole prefix cache as `BlockStored` events, parents before children, stamped
        with the id of the last event emitted (the state they describe)."""
        last = self._next_event_id - 1
        out: list[KvEvent] = []
        done: set[int] = set()
        for h in self._cached:
            # Walk up to the first ancestor already emitted (or not cached), then emit down.
            chain: list[int] = []
            cur: int | None = h
            while cur is not None and cur in self._cached and cur not in done:
                chain.append(cur)
                cur = self.blocks[self._cached[cur]].parent_hash
            for link in reversed(chain):
                done.add(link)
                block = self.blocks[self._cached[link]]
                data = BlockStored(
                    block_hashes=[link],
                    parent_hash=block.parent_hash,
                    token_ids=list(block.token_ids),
                    block_size=self.block_size,
                    lora_name=block.lora_name,
                )
                out.append(KvEvent(worker_id=self.worker_id, event_id=last, data=data))
        if self.offload is not None:
            for data in self.offload.kv_state():
                out.append(KvEvent(worker_id=self.worker_id, event_id=last, data=data))
        return out

    # -- internals -----------------------------------------------------------------------

    def _hash_full_blocks(self, seq: Sequence, upto: int | None = None) -> None:
        full = seq.num_tokens // self.block_size if upto is None else upto
        have = len(seq.block_hashes)
        if full > have:
            start = have * self.block_size
            parent = seq.block_hashes[-1] if have else None
            seq.block_hashes.extend(
                block_hashes(
                    seq.token_ids[start : full * self.block_size],
                    self.block_size,
                    parent=parent,
                    lora_name=seq.lora_name,
                )
            )

    def _cacheable(self, seq: Sequence) -> bool:
        # Prompt embeddings have no token ids to hash: their KV is the request's alone.
        return self.prefix_caching and seq.prompt_embeds is None

    def _acquire(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]
        block.ref_count += 1

    def _allocate(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None:
            if self._cached.get(block.hash) == block_id:
                del self._cached[block.hash]
                self._emit(BlockRemoved(block_hashes=[block.hash]))
                if self.offload is not None:
                    self.evicted.append(
                        EvictedBlock(
                            block.hash,
                            block.parent_hash,
                            tuple(block.token_ids),
                            block_id,
                            block.lora_name,
                        )
                    )
            block.hash, block.parent_hash, block.token_ids = None, None, []
        block.ref_count = 1
        return block_id

    def emit(self, data: KvEventData) -> None:
        """Publish an event of a lower tier in this cache's event sequence."""
        self._emit(data)

    def _emit(self, data: KvEventData) -> None:
        self._events.append(
            KvEvent(worker_id=self.worker_id, event_id=self._next_event_id, data=data)
        )
        self._next_event_id += 1
