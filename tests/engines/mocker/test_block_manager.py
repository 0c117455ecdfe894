import pytest

from stator.engines.mocker.block_manager import BlockManager, NoFreeBlocks
from stator.kv.hashing import block_hashes
from stator.protocols import AllCleared, BlockRemoved, BlockStored

BS = 4


def store_chain(bm: BlockManager, tokens: list[int]) -> list[int]:
    """Allocate and commit `tokens` as one sequence; returns its block hashes."""
    hashes = block_hashes(tokens, BS)
    bm.allocate(len(hashes))
    for i, h in enumerate(hashes):
        bm.commit(h, hashes[i - 1] if i else None, tokens[i * BS : (i + 1) * BS])
    return hashes


def test_allocate_commit_release_counts():
    bm = BlockManager(8, BS)
    hashes = store_chain(bm, list(range(12)))
    assert bm.num_active_blocks == 3 and bm.num_free_blocks == 5
    assert [bm.refcount(h) for h in hashes] == [1, 1, 1]
    bm.release(hashes, 0)
    assert bm.num_active_blocks == 0 and bm.num_free_blocks == 8
    assert all(bm.is_cached(h) for h in hashes)  # freed blocks stay as cache


def test_shared_prefix_is_reference_counted_and_deduplicated():
    bm = BlockManager(8, BS)
    a = store_chain(bm, list(range(8)))
    hits, inactive = bm.match_prefix(block_hashes([*range(8), 9, 9, 9, 9], BS))
    assert (hits, inactive) == (2, 0)
    bm.acquire_cached(a)
    assert [bm.refcount(h) for h in a] == [2, 2]
    # A second sequence that computes the same block shares it; its own copy is freed.
    bm.allocate(1)
    free_before = bm.num_free_blocks
    bm.commit(a[0], None, list(range(4)))
    assert bm.refcount(a[0]) == 3
    assert bm.num_free_blocks == free_before + 1
    bm.release(a, 0)
    bm.release(a, 0)
    bm.release(a[:1], 0)
    assert bm.num_active_blocks == 0


def test_hash_chain_matches_shared_hash_function():
    bm = BlockManager(16, BS)
    tokens = list(range(100, 120))
    store_chain(bm, tokens)
    (event,) = bm.drain_events()
    assert isinstance(event.data, BlockStored)
    assert event.data.block_hashes == block_hashes(tokens, BS)
    assert event.data.parent_hash is None
    assert event.data.token_ids == tokens
    assert event.data.block_size == BS


def test_inactive_blocks_are_reused_from_cache():
    bm = BlockManager(4, BS)
    hashes = store_chain(bm, list(range(8)))
    bm.release(hashes, 0)
    assert bm.match_prefix(hashes) == (2, 2)
    bm.acquire_cached(hashes)
    assert bm.num_active_blocks == 2
    assert bm.inactive_hashes() == []


def test_eviction_is_lru_and_tail_first():
    bm = BlockManager(4, BS)
    old = store_chain(bm, list(range(8)))
    new = store_chain(bm, list(range(50, 58)))
    bm.release(old, 0)
    bm.release(new, 0)
    # Oldest release first; within it the deepest block first.
    assert bm.inactive_hashes() == [old[1], old[0], new[1], new[0]]
    bm.drain_events()
    bm.allocate(1)
    assert not bm.is_cached(old[1]) and bm.is_cached(old[0])
    (event,) = bm.drain_events()
    assert event.data == BlockRemoved(block_hashes=[old[1]])
    bm.allocate(2)
    (event,) = bm.drain_events()
    assert event.data == BlockRemoved(block_hashes=[old[0], new[1]])


def test_touching_a_cached_block_makes_it_recent():
    bm = BlockManager(4, BS)
    a = store_chain(bm, list(range(4)))
    b = store_chain(bm, list(range(10, 14)))
    bm.release(a, 0)
    bm.release(b, 0)
    bm.acquire_cached(a)
    bm.release(a, 0)
    assert bm.inactive_hashes() == [b[0], a[0]]


def test_allocation_beyond_capacity_fails():
    bm = BlockManager(2, BS)
    bm.allocate(2)
    with pytest.raises(NoFreeBlocks):
        bm.allocate(1)
    bm.release([], 2)
    assert bm.num_free_blocks == 2


def test_event_ids_increase_by_one():
    bm = BlockManager(2, BS, worker_id=7, dp_rank=1)
    ids = []
    for start in (0, 100, 200):
        hashes = store_chain(bm, list(range(start, start + 8)))
        bm.release(hashes, 0)
        ids += [e.event_id for e in bm.drain_events()]
        assert all(e.worker_id == 7 for e in bm.kv_state())
    assert ids == list(range(len(ids)))
    assert len(ids) == 5  # stored, then (removed, stored) twice


def test_no_prefix_caching_means_no_cache_and_no_events():
    bm = BlockManager(4, BS, enable_prefix_caching=False)
    hashes = store_chain(bm, list(range(8)))
    assert bm.match_prefix(hashes) == (0, 0)
    bm.release(hashes, 0)
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 0
    assert bm.drain_events() == []


def test_kv_state_lists_every_cached_block_parents_first():
    bm = BlockManager(8, BS)
    a = store_chain(bm, list(range(12)))
    bm.release(a, 0)
    state = bm.kv_state()
    assert [e.data.block_hashes[0] for e in state] == a
    assert [e.data.parent_hash for e in state] == [None, a[0], a[1]]


def test_clear_forgets_cache_and_frees_blocks_later():
    bm = BlockManager(4, BS)
    held = store_chain(bm, list(range(4)))
    idle = store_chain(bm, list(range(20, 24)))
    bm.release(idle, 0)
    bm.drain_events()
    bm.clear()
    assert [e.data for e in bm.drain_events()] == [AllCleared()]
    assert bm.num_cached_blocks == 0 and bm.num_free_blocks == 3
    bm.release(held, 0)
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 0
