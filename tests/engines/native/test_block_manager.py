"""The block pool and prefix cache alone (no model)."""

from __future__ import annotations

from stator.engines.native.block_manager import BlockManager
from stator.engines.native.request import SamplingSpec, Sequence
from stator.kv.hashing import block_hashes
from stator.protocols import AllCleared, BlockRemoved, BlockStored


def seq(tokens: list[int], rid: str = "r") -> Sequence:
    return Sequence(rid, list(tokens), len(tokens), SamplingSpec(), 10_000)


def compute(bm: BlockManager, s: Sequence, upto: int | None = None) -> None:
    """Pretend the model computed the sequence's tokens, then commit them."""
    s.num_computed_tokens = s.num_tokens if upto is None else upto
    bm.commit(s)


def test_stored_blocks_are_hit_by_the_same_prefix_and_events_describe_them():
    bm = BlockManager(10, 4, worker_id=7)
    tokens = list(range(1, 11))  # 2 full blocks + 2 tokens
    a = seq(tokens, "a")
    assert bm.admit(a, a.num_tokens)
    assert len(a.block_ids) == 3 and a.num_computed_tokens == 0
    compute(bm, a)
    events = bm.drain_events()
    assert [e.event_id for e in events] == [0]
    stored = events[0].data
    assert isinstance(stored, BlockStored) and events[0].worker_id == 7
    assert stored.block_hashes == block_hashes(tokens, 4)
    assert stored.parent_hash is None and stored.token_ids == tokens[:8] and stored.block_size == 4

    b = seq([*tokens[:8], 99, 98], "b")
    assert bm.admit(b, b.num_tokens)
    assert b.num_computed_tokens == 8 and b.num_cached_tokens == 8
    assert b.block_ids[:2] == a.block_ids[:2]
    assert bm.blocks[a.block_ids[0]].ref_count == 2


def test_the_last_token_is_never_served_from_the_cache():
    bm = BlockManager(10, 4)
    a = seq(list(range(8)), "a")
    bm.admit(a, 8)
    compute(bm, a)
    bm.free(a)
    b = seq(list(range(8)), "b")
    bm.admit(b, 8)
    assert b.num_computed_tokens == 4  # one block recomputed so a token is left to sample


def test_freed_cached_blocks_are_reused_lru_and_evictions_are_reported():
    bm = BlockManager(4, 2)
    a = seq([1, 2, 3, 4, 5], "a")
    bm.admit(a, 5)
    compute(bm, a)
    bm.free(a)
    assert bm.num_free_blocks == 4 and bm.num_used_blocks == 0
    bm.drain_events()
    # A 4-block newcomer takes the never-used block first, then a's blocks tail first.
    b = seq([9] * 8, "b")
    assert bm.admit(b, 8)
    removed = [e.data for e in bm.drain_events() if isinstance(e.data, BlockRemoved)]
    a_hashes = block_hashes([1, 2, 3, 4, 5], 2)
    assert [r.block_hashes for r in removed] == [[a_hashes[1]], [a_hashes[0]]]


def test_admission_fails_without_free_blocks_and_changes_nothing():
    bm = BlockManager(2, 4)
    a = seq(list(range(8)), "a")
    assert bm.admit(a, 8)
    b = seq(list(range(100, 105)), "b")
    assert not bm.admit(b, 5)
    assert b.block_ids == [] and bm.num_free_blocks == 0
    assert not bm.grow(a, 9)


def test_cache_hits_count_against_free_blocks_correctly():
    bm = BlockManager(3, 4)
    a = seq(list(range(9)), "a")
    bm.admit(a, 9)
    compute(bm, a)
    bm.free(a)
    # Needs the 2 cached blocks (free, reusable) + 1 new: exactly the pool.
    b = seq([*range(8), 50, 51, 52], "b")
    assert bm.admit(b, b.num_tokens)
    assert b.num_computed_tokens == 8 and len(b.block_ids) == 3


def test_duplicate_content_is_cached_once():
    bm = BlockManager(10, 4)
    a, b = seq(list(range(6)), "a"), seq(list(range(6)), "b")
    bm.admit(a, 6)
    bm.admit(b, 6)  # admitted before a computed: no hit
    compute(bm, a)
    compute(bm, b)
    stored = [e.data for e in bm.drain_events()]
    assert len(stored) == 1
    bm.free(a)
    bm.free(b)
    assert sum(1 for blk in bm.blocks if blk.hash is not None) == 1


def test_kv_state_and_clear():
    bm = BlockManager(10, 2, worker_id=3)
    a = seq([1, 2, 3, 4, 5, 6, 7], "a")
    bm.admit(a, 7)
    compute(bm, a)
    state = bm.kv_state()
    hashes = block_hashes([1, 2, 3, 4, 5, 6], 2)
    assert [e.data.block_hashes for e in state] == [[h] for h in hashes]
    assert [e.data.parent_hash for e in state] == [None, hashes[0], hashes[1]]
    assert state[1].data.token_ids == [3, 4]
    assert {e.event_id for e in state} == {0}
    bm.clear()
    events = bm.drain_events()
    assert isinstance(events[-1].data, AllCleared) and events[-1].event_id == 1
    assert bm.kv_state() == []
    bm.free(a)
    b = seq([1, 2, 3, 4, 5, 6, 7], "b")
    bm.admit(b, 7)
    assert b.num_computed_tokens == 0
