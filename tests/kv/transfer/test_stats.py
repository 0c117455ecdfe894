"""`TransferStats`: busy time counts the span with any pull in flight once, however many
pulls overlap in it."""

from __future__ import annotations

import time

from stator.kv.transfer.result import PullResult
from stator.kv.transfer.stats import WINDOW_GAP_S, TransferStats


def test_busy_time_is_the_union_of_overlapping_pulls():
    stats = TransferStats()
    stats.begin()
    stats.begin()  # a second pull while the first runs
    time.sleep(0.02)
    stats.end()
    time.sleep(0.02)
    stats.end()
    busy = stats.busy_seconds
    assert 0.04 <= busy < 0.2 and stats.in_flight == 0
    time.sleep(0.05)  # idle: not counted
    stats.begin()
    stats.end()
    assert stats.busy_seconds - busy < 0.01
    assert stats.gauges()["kv_transfer_busy_seconds_total"] == stats.busy_seconds


def test_coalesced_pulls_count_one_copy_batch_between_them():
    stats = TransferStats()
    for _ in range(4):
        stats.record(PullResult("ipc", 100, 1, 0.001, batched=4))
    stats.record(PullResult("ipc", 100, 1, 0.001))
    gauges = stats.gauges()
    assert gauges["kv_transfers_total"] == 5 and gauges["kv_transfer_copy_batches_total"] == 2


def test_window_spans_a_burst_gaps_included_and_a_quiet_gap_opens_a_new_one():
    stats = TransferStats()
    stats.begin()
    first = stats.window_start
    stats.end()
    time.sleep(0.03)  # a short gap inside the burst: same window, not busy
    stats.begin()
    stats.end()
    gauges = stats.gauges()
    assert gauges["kv_transfer_window_start_time"] == first
    span = gauges["kv_transfer_last_end_time"] - first
    assert span >= 0.03 > stats.busy_seconds
    time.sleep(WINDOW_GAP_S + 0.01)
    stats.begin()
    assert stats.window_start > stats.last_end >= first
    stats.end()
