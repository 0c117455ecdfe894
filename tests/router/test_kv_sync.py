from stator.protocols import AllCleared, BlockRemoved, BlockStored, KvEvent
from stator.router.kv_index import KvIndex
from stator.router.kv_sync import KvEventSync

W = 42


def stored(event_id: int, *hashes: int, worker: int = W, rank: int = 0) -> KvEvent:
    return KvEvent(
        worker_id=worker,
        event_id=event_id,
        dp_rank=rank,
        data=BlockStored(block_hashes=list(hashes)),
    )


def removed(event_id: int, *hashes: int) -> KvEvent:
    return KvEvent(worker_id=W, event_id=event_id, data=BlockRemoved(block_hashes=list(hashes)))


def make() -> tuple[KvIndex, KvEventSync]:
    index = KvIndex(4)
    return index, KvEventSync(index)


def test_events_in_order_are_applied():
    index, sync = make()
    assert not sync.apply(stored(1, 10, 11))
    assert not sync.apply(stored(2, 12))
    assert not sync.apply(removed(3, 12))
    assert index.find_matches([10, 11, 12]) == {(W, 0): 2}
    assert not sync.apply(KvEvent(worker_id=W, event_id=4, data=AllCleared()))
    assert index.tree_size((W, 0)) == 0


def test_zero_based_numbering_is_a_clean_start():
    index, sync = make()
    assert not sync.apply(stored(0, 10))
    assert not sync.apply(stored(1, 11))
    assert index.find_matches([10, 11]) == {(W, 0): 2}


def test_duplicates_are_ignored():
    index, sync = make()
    sync.apply(stored(1, 10))
    sync.apply(removed(2, 10))
    assert not sync.apply(stored(1, 10))
    assert index.tree_size((W, 0)) == 0


def test_gap_asks_for_resync_and_buffers_until_state_arrives():
    index, sync = make()
    sync.apply(stored(1, 10))
    assert sync.apply(stored(5, 13)) is True  # events 2-4 were lost
    assert sync.gaps == 1
    assert sync.resyncing(W)
    assert not sync.apply(stored(6, 14))  # buffered, not applied yet
    assert index.tree_size((W, 0)) == 1
    # The worker's state as of event 5: it holds 10, 11, 13 (12 was stored and removed).
    state = [stored(5, 10, 11, 13)]
    sync.finish_resync(W, state)
    assert not sync.resyncing(W)
    assert sorted(index.holders(h)[0][1] for h in (10, 11, 13, 14)) == [0, 0, 0, 0]
    assert index.tree_size((W, 0)) == 4  # 14 (event 6) replayed on top; 13 not twice
    assert not sync.apply(stored(7, 15))
    assert index.tree_size((W, 0)) == 5


def test_first_event_that_is_not_the_first_means_we_missed_some():
    index, sync = make()
    assert sync.apply(stored(100, 10)) is True
    sync.finish_resync(W, [stored(100, 7, 8)])
    assert index.tree_size((W, 0)) == 2  # the state replaces what the events said


def test_resync_from_a_state_without_usable_ids_takes_the_next_event_as_baseline():
    index, sync = make()
    assert sync.begin_resync(W)
    assert not sync.begin_resync(W)
    sync.finish_resync(W, [])  # empty cache: the state names no position
    assert not sync.apply(stored(73, 10))  # no second resync
    assert not sync.apply(stored(74, 11))
    assert sync.apply(stored(80, 12)) is True  # but real gaps still count
    assert index.tree_size((W, 0)) == 2


def test_abandoned_resync_replays_the_buffer():
    index, sync = make()
    sync.apply(stored(1, 10))
    assert sync.apply(stored(3, 12))
    sync.apply(stored(4, 13))
    sync.abandon_resync(W)
    assert index.tree_size((W, 0)) == 3
    assert not sync.apply(stored(5, 14))


def test_ranks_are_numbered_separately():
    index, sync = make()
    assert not sync.apply(stored(1, 10, rank=0))
    assert not sync.apply(stored(1, 20, rank=1))
    assert not sync.apply(stored(2, 21, rank=1))
    assert index.find_matches([20, 21]) == {(W, 1): 2}


def test_remove_worker_drops_everything():
    index, sync = make()
    sync.apply(stored(1, 10))
    sync.apply(stored(1, 10, worker=7))
    sync.remove_worker(W)
    assert index.find_matches([10]) == {(7, 0): 1}
    # Back again, it starts over.
    assert not sync.apply(stored(1, 10))


def test_without_a_state_to_fetch_a_gap_is_bridged():
    # vLLM workers cannot dump their cache: the index keeps what it knew and goes on.
    index = KvIndex(4)
    sync = KvEventSync(index, state_available=False)
    assert not sync.apply(stored(1, 10, 11))
    assert not sync.apply(stored(5, 12))  # 2..4 lost
    assert sync.gaps == 1 and not sync.resyncing(W)
    assert index.find_matches([10, 11, 12]) == {(W, 0): 3}
    assert not sync.apply(stored(5, 13))  # a duplicate is still a duplicate
    assert not sync.apply(removed(6, 12))
    assert index.find_matches([10, 11, 12]) == {(W, 0): 2}


def test_without_a_state_to_fetch_the_first_event_heard_is_the_start():
    index = KvIndex(4)
    sync = KvEventSync(index, state_available=False)
    assert not sync.apply(stored(7, 10))  # the worker was up before us
    assert not sync.apply(stored(8, 11))
    assert sync.gaps == 0
    assert index.find_matches([10, 11]) == {(W, 0): 2}
