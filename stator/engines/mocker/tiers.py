"""The simulated host and disk tiers below the mocker's KV cache.

Two LRU sets of block hashes with capacities, fed by the GPU cache's evictions: a block
evicted from the GPU goes to host memory, one pushed out of host memory goes to disk (which
keeps its copy when the block is promoted back). A prompt whose GPU hit ends where a lower
tier continues loads those blocks instead of computing them; the engine charges the copy
at the configured bandwidths (`MockerConfig.host_load_bandwidth`, `disk_load_bandwidth`).
As the native engine, it emits KV events with the tier, so routing with tiers can be tested
at scale. Pure bookkeeping, like the block manager.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from stator.protocols import BlockRemoved, BlockStored, KvEventData


class _Meta(NamedTuple):
    parent: int | None
    tokens: list[int]


class LowerTiers:
    def __init__(
        self,
        host_blocks: int,
        disk_blocks: int,
        block_size: int,
        emit: Callable[[KvEventData], None],
    ) -> None:
        self.host_capacity = host_blocks
        self.disk_capacity = disk_blocks
        self.block_size = block_size
        self._emit = emit
        self.host: OrderedDict[int, _Meta] = OrderedDict()  # first = evicted first
        self.disk: OrderedDict[int, _Meta] = OrderedDict()
        self.hits = {"host": 0, "disk": 0}
        self.saved = {"host": 0, "disk": 0}

    def offload(self, block_hash: int, parent: int | None, tokens: list[int]) -> None:
        """A block the GPU cache evicted."""
        if self.host_capacity <= 0:
            self._to_disk(block_hash, _Meta(parent, tokens))
            return
        if block_hash in self.host:
            self.host.move_to_end(block_hash)
            return
        self._put_host(block_hash, _Meta(parent, tokens))

    def match(self, hashes: list[int]) -> tuple[int, int]:
        """(leading `hashes` a lower tier holds, how many of those only on disk)."""
        n = disk_only = 0
        for h in hashes:
            if h in self.host:
                pass
            elif h in self.disk:
                disk_only += 1
            else:
                break
            n += 1
        return n, disk_only

    def load(self, hashes: list[int]) -> None:
        """Blocks found by `match` are being copied back: most recent in their tiers, and
        disk blocks staged through host memory (when there is a host tier)."""
        for h in hashes:
            if h in self.host:
                self.host.move_to_end(h)
                self.hits["host"] += 1
            else:
                self.disk.move_to_end(h)
                self.hits["disk"] += 1
                if self.host_capacity > 0:
                    self._put_host(h, self.disk[h])

    def clear(self) -> None:
        self.host.clear()
        self.disk.clear()

    def kv_state(self) -> list[BlockStored]:
        out = []
        for tier, blocks in (("host", self.host), ("disk", self.disk)):
            present = set(blocks)
            for h in _parents_first(blocks):
                if h in present:
                    out.append(self._stored(tier, h, blocks[h]))
        return out

    # -- internals ----------------------------------------------------------------------

    def _put_host(self, block_hash: int, meta: _Meta) -> None:
        while len(self.host) >= self.host_capacity:
            old, old_meta = self.host.popitem(last=False)
            self._emit(BlockRemoved(block_hashes=[old], tier="host"))
            self._to_disk(old, old_meta)
        self.host[block_hash] = meta
        self.saved["host"] += 1
        self._emit(self._stored("host", block_hash, meta))

    def _to_disk(self, block_hash: int, meta: _Meta) -> None:
        if self.disk_capacity <= 0:
            return
        if block_hash in self.disk:
            self.disk.move_to_end(block_hash)
            return
        while len(self.disk) >= self.disk_capacity:
            old, _ = self.disk.popitem(last=False)
            self._emit(BlockRemoved(block_hashes=[old], tier="disk"))
        self.disk[block_hash] = meta
        self.saved["disk"] += 1
        self._emit(self._stored("disk", block_hash, meta))

    def _stored(self, tier: str, block_hash: int, meta: _Meta) -> BlockStored:
        return BlockStored(
            block_hashes=[block_hash],
            parent_hash=meta.parent,
            token_ids=list(meta.tokens),
            block_size=self.block_size,
            tier=tier,
        )


def _parents_first(blocks: OrderedDict[int, _Meta]) -> list[int]:
    done: set[int] = set()
    out: list[int] = []
    for h in blocks:
        chain = []
        cur: int | None = h
        while cur is not None and cur in blocks and cur not in done:
            chain.append(cur)
            cur = blocks[cur].parent
        for link in reversed(chain):
            done.add(link)
            out.append(link)
    return out
