from __future__ import annotations

import numpy as np
import pytest
import torch

from stator.kv.block_copy import block_shape, gather, pool_shape
from stator.kv.offload import EvictedBlock, LoadPolicy, OffloadManager
from stator.kv.offload.disk import DiskTier
from stator.kv.offload.host import BlockMeta, HostTier
from stator.protocols import BlockRemoved, BlockStored


def test_policy_loads_when_the_copy_beats_the_prefill():
    p = LoadPolicy("auto", block_bytes=1_000_000, block_size=16)
    assert p.should_load(1, 0)  # nothing measured yet: load
    p.observe_host_copy(10_000_000, 0.001)  # 10 GB/s: 0.1 ms per block
    p.observe_prefill(1000, 0.1)  # 100 us per token: 1.6 ms per block
    assert p.should_load(4, 0)
    p.observe_disk_read(1_000_000, 0.01)  # 100 MB/s: 10 ms per block from disk
    assert not p.should_load(0, 4)
    assert LoadPolicy("never").should_load(100, 0) is False
    assert LoadPolicy("always").should_load(1, 1) is True
    with pytest.raises(ValueError):
        LoadPolicy("sometimes")


def test_host_tier_is_lru_and_hands_out_low_slots_first():
    host = HostTier(3, (2,), torch.float32, pin=False)
    slots, evicted = host.take(2)
    assert slots == [0, 1] and evicted == []
    host.put(10, 0, BlockMeta(None, (1,)))
    host.put(11, 1, BlockMeta(10, (2,)))
    host.touch(10)
    slots, evicted = host.take(2)
    assert slots == [1, 2] and [e[0] for e in evicted] == [11]
    assert 10 in host and 11 not in host


def test_disk_tier_reads_pending_and_written_blocks_and_evicts_oldest(tmp_path):
    layout = {"model": "m"}
    disk = DiskTier(tmp_path, capacity_blocks=2, block_bytes=8, layout=layout)
    a, b, c = (np.full(8, i, dtype=np.uint8) for i in (1, 2, 3))
    assert disk.put(1, BlockMeta(None, (5,)), a) == []
    out = np.zeros(8, dtype=np.uint8)
    disk.read_into(1, out)
    assert (out == 1).all()
    disk.put(2, BlockMeta(1, (6,)), b)
    assert disk.put(3, BlockMeta(2, (7,)), c) == [1]
    disk.flush()
    disk.read_into(3, out)
    assert (out == 3).all()
    assert sorted(p.name for p in tmp_path.glob("*.kv")) == [f"{2:016x}.kv", f"{3:016x}.kv"]
    disk.close()
    again = DiskTier(tmp_path, capacity_blocks=2, block_bytes=8, layout=layout)
    assert again.hashes() == [2, 3] and again.meta[3] == BlockMeta(2, (7,))
    again.close()


def test_manager_saves_demotes_and_loads_with_tier_events(tmp_path):
    pool = torch.randn(pool_shape(2, 6, 4, 1, 3))
    events = []
    per_block = 2 * 2 * 4 * 1 * 3 * 4
    m = OffloadManager(
        pool,
        block_size=4,
        host_bytes=2 * per_block,
        disk_dir=tmp_path,
        disk_bytes=8 * per_block,
        policy="always",
        emit=events.append,
    )
    expected = {h: gather(pool, [h])[0].clone() for h in range(3)}
    blocks = [EvictedBlock(h, h - 1 if h else None, (h,) * 4, h) for h in range(3)]
    m.save(blocks[:2])
    assert [(type(e).__name__, e.tier, e.block_hashes) for e in events] == [
        ("BlockStored", "host", [0, 1])
    ]
    m.save(blocks[2:])
    # Three blocks, two host slots: the oldest went on to disk.
    assert len(m.host) == 2 and 0 in m.disk and 0 not in m.host
    assert [(type(e).__name__, e.tier, e.block_hashes) for e in events[1:]] == [
        ("BlockRemoved", "host", [0]),
        ("BlockStored", "disk", [0]),
        ("BlockStored", "host", [2]),
    ]
    assert m.match([0, 1, 2, 9]) == (2, 1)  # capped at the 2 host slots
    pool.zero_()
    assert m.load([0, 1], [4, 5]) == [4, 5]
    assert torch.equal(gather(pool, [4])[0], expected[0])
    assert torch.equal(gather(pool, [5])[0], expected[1])
    assert m.stats.hits == {"host": 1, "disk": 1}
    tiers = {(type(e), e.tier) for e in events if isinstance(e, BlockStored | BlockRemoved)}
    assert (BlockStored, "disk") in tiers and (BlockRemoved, "host") in tiers
    state = m.kv_state()
    assert {e.tier for e in state} == {"host", "disk"}
    m.close()
    assert m.host.buffer.numel() == 0


def test_block_shape_of_host_slots_matches_the_pool():
    pool = torch.zeros(pool_shape(3, 5, 4, 2, 8))
    assert block_shape(pool) == (3, 2, 4, 2, 8)
