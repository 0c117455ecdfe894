"""The mocker's simulated host and disk tiers."""

from __future__ import annotations

from stator.engines.mocker.block_manager import BlockManager
from stator.engines.mocker.scheduler import Scheduler
from stator.protocols import BlockRemoved, BlockStored
from tests.engines.mocker.test_scheduler import BS, seq


def _run(s: Scheduler, q):
    """Run `q` to the end of its prompt plus one token, then finish it; returns its steps."""
    s.add(q)
    steps = []
    while True:
        step = s.schedule()
        steps.append(step)
        if q in s.complete(step):
            s.finish(q)
            return steps


def _tiers(events):
    return [(type(d).__name__, d.tier) for d in events]


def test_evicted_prefix_comes_back_from_host():
    blocks = BlockManager(6, BS)
    blocks.enable_tiers(host_blocks=8, disk_blocks=0)
    s = Scheduler(blocks)
    _run(s, seq("a", 17))  # 4 full blocks
    _run(s, seq("b", 21, start=100))  # 5 more: evicts a's
    events = [e.data for e in blocks.drain_events()]
    assert ("BlockStored", "host") in _tiers(events)
    assert len(blocks.lower.host) >= 3
    again = seq("a2", 17)
    steps = _run(s, again)
    assert steps[0].loaded_host >= 3
    assert again.num_cached >= 3 * BS
    # The loaded blocks are GPU-cached again (and still in host memory).
    stored = [d for e in blocks.drain_events() if isinstance(d := e.data, BlockStored)]
    assert any(d.tier == "gpu" for d in stored)
    assert blocks.lower.hits["host"] >= 3


def test_host_overflow_goes_to_disk_and_disk_hits_count():
    blocks = BlockManager(6, BS)
    blocks.enable_tiers(host_blocks=2, disk_blocks=16)
    s = Scheduler(blocks)
    _run(s, seq("a", 17))
    _run(s, seq("b", 21, start=100))
    _run(s, seq("c", 21, start=200))
    events = [e.data for e in blocks.drain_events()]
    kinds = _tiers(events)
    assert ("BlockRemoved", "host") in kinds and ("BlockStored", "disk") in kinds
    assert all(d.tier == "gpu" for d in events if isinstance(d, BlockRemoved) and d.tier == "gpu")
    steps = _run(s, seq("a2", 17))
    assert steps[0].loaded_disk >= 2
    state = blocks.kv_state()
    assert {e.data.tier for e in state} == {"gpu", "host", "disk"}


def test_no_tiers_is_unchanged():
    blocks = BlockManager(6, BS)
    blocks.enable_tiers(0, 0)
    assert blocks.lower is None
