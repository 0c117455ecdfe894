import asyncio

import pytest

from stator.protocols import LoadReport
from stator.router.busy import AdmissionQueue, BusyThresholds, is_busy
from stator.router.load import LoadTracker

K = (1, 0)


def test_booking_lifecycle():
    tracker = LoadTracker(default_total_blocks=100)
    tracker.add("r1", K, prefill_tokens=64, blocks=5)
    tracker.add("r2", K, prefill_tokens=32, blocks=3)
    load = tracker.load(K)
    assert (load.prefill_tokens, load.active_blocks, load.inflight) == (96, 8, 2)
    tracker.prefill_done("r1")
    tracker.prefill_done("r1")  # twice is harmless
    assert (load.prefill_tokens, load.active_blocks) == (32, 8)
    tracker.finish("r1")
    tracker.finish("r2")
    assert (load.prefill_tokens, load.active_blocks, load.inflight) == (0, 0, 0)
    assert tracker.finish("nope") is None


def test_load_report_corrects_the_estimate():
    tracker = LoadTracker(default_total_blocks=100)
    tracker.add("r1", K, 0, 10)
    # The engine holds 40 blocks (other frontends' requests too) out of 200.
    tracker.report(
        LoadReport(worker_id=1, active_kv_blocks=40, total_kv_blocks=200, queued_prefill_tokens=500)
    )
    load = tracker.load(K)
    assert load.active_blocks == 40 and load.total_blocks == 200
    assert load.queued_prefill_tokens == 500
    tracker.add("r2", K, 0, 5)
    assert load.active_blocks == 45
    tracker.finish("r1")  # the engine freed r1's blocks since the report
    assert load.active_blocks == 35


def test_load_report_keeps_the_requests_still_queued_in_the_engine():
    tracker = LoadTracker(default_total_blocks=100)
    tracker.add("admitted", K, 64, 4, hashes=[1, 2, 3, 4])
    tracker.add("queued-a", K, 64, 5, hashes=[1, 2, 7, 8])  # shares 2 blocks with admitted
    tracker.add("queued-b", K, 64, 3)
    # The engine runs `admitted` (4 blocks + 1 for its output) and has 2 requests waiting.
    tracker.report(LoadReport(worker_id=1, active_kv_blocks=5, num_waiting=2, num_running=1))
    load = tracker.load(K)
    # 5 reported + queued-a's 2 unshared hashed blocks and 1 unhashed + queued-b's 3.
    assert load.active_blocks == 5 + 3 + 3
    tracker.finish("queued-b")  # it ran and finished before the next report
    assert load.active_blocks == 5 + 3
    # With nothing waiting the report is the whole truth, as before.
    tracker.report(LoadReport(worker_id=1, active_kv_blocks=9, num_waiting=0, num_running=2))
    assert load.active_blocks == 9


def test_shared_prefix_blocks_count_once():
    tracker = LoadTracker()
    tracker.add("r1", K, 0, 4, hashes=[1, 2, 3])  # 3 full blocks + a partial one
    tracker.add("r2", K, 0, 3, hashes=[1, 2, 7])  # shares blocks 1 and 2
    load = tracker.load(K)
    assert load.active_blocks == 4 + 1
    assert load.active_depth([1, 2, 3, 9]) == 3 and load.active_depth([5]) == 0
    tracker.finish("r1")
    assert load.active_blocks == 3 and load.active_depth([1, 2, 3]) == 2
    tracker.finish("r2")
    assert load.active_blocks == 0 and load.active == {}


def test_remove_worker_forgets_its_bookings():
    tracker = LoadTracker()
    tracker.add("r1", K, 10, 1)
    tracker.remove_worker(1)
    assert tracker.bookings == {}
    assert tracker.load(K).inflight == 0


def test_busy_thresholds():
    tracker = LoadTracker(default_total_blocks=100)
    load = tracker.load(K)
    off = BusyThresholds()
    blocks = BusyThresholds(active_decode_blocks_threshold=0.5)
    tokens = BusyThresholds(active_prefill_tokens_threshold=1000)
    tracker.add("r", K, 2000, 60)
    assert not off.enabled and not is_busy(load, off)
    assert is_busy(load, blocks)
    assert is_busy(load, tokens)
    tracker.prefill_done("r")
    assert not is_busy(load, tokens)
    tracker.finish("r")
    assert not is_busy(load, blocks)


@pytest.mark.parametrize(
    "bad",
    [
        BusyThresholds(active_decode_blocks_threshold=1.5),
        BusyThresholds(active_prefill_tokens_threshold=-1),
    ],
)
def test_bad_thresholds(bad):
    with pytest.raises(ValueError):
        bad.validate()


async def test_queue_order_fcfs_and_priority():
    fcfs = AdmissionQueue(3, "fcfs")
    t1, t2 = fcfs.enter(0), fcfs.enter(9)
    assert fcfs.is_head(t1) and not fcfs.is_head(t2)
    fcfs.leave(t1)
    assert fcfs.is_head(t2)
    prio = AdmissionQueue(3, "priority")
    low, high = prio.enter(0), prio.enter(9)
    assert prio.is_head(high) and not prio.is_head(low)
    prio.enter(1)
    assert prio.full
    with pytest.raises(ValueError):
        AdmissionQueue(1, "lifo")


async def test_queue_wake_ends_the_wait():
    queue = AdmissionQueue(2, recheck=30.0)
    ticket = queue.enter(0)
    waiter = asyncio.create_task(queue.wait_turn(ticket))
    await asyncio.sleep(0)
    queue.wake()
    await asyncio.wait_for(waiter, 5)
