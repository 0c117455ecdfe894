import pytest

from stator.router.approx import ApproxKvIndex

A, B = (1, 0), (2, 0)


def test_recorded_prompts_match_until_their_ttl_passes():
    approx = ApproxKvIndex(block_size=4, ttl=10.0, max_blocks=1000)
    approx.record(A, [1, 2, 3], now=0.0)
    approx.record(B, [1], now=5.0)
    assert approx.find_matches([1, 2, 3, 4], now=9.0) == {A: 3, B: 1}
    assert approx.find_matches([1, 2, 3], now=10.5) == {B: 1}
    assert approx.tree_size(A) == 0
    assert approx.find_matches([1], now=15.5) == {}
    assert len(approx) == 0


def test_reuse_refreshes_the_ttl():
    approx = ApproxKvIndex(block_size=4, ttl=10.0, max_blocks=1000)
    approx.record(A, [1, 2], now=0.0)
    approx.record(A, [1], now=8.0)
    assert approx.find_matches([1, 2], now=12.0) == {A: 1}
    assert approx.find_matches([1, 2], now=18.5) == {}


def test_size_cap_prunes_oldest_first_to_80_percent():
    approx = ApproxKvIndex(block_size=4, ttl=100.0, max_blocks=10)
    for i in range(10):
        approx.record(A, [i], now=float(i))
    assert len(approx) == 10
    approx.record(B, [100], now=10.0)  # 11 > 10: prune to 8
    assert len(approx) == 8
    assert approx.find_matches([0], now=10.0) == {}
    assert approx.find_matches([2], now=10.0) == {}
    assert approx.find_matches([3], now=10.0) == {A: 1}
    assert approx.find_matches([100], now=10.0) == {B: 1}


def test_remove_worker():
    approx = ApproxKvIndex(block_size=4, ttl=100.0, max_blocks=10)
    approx.record(A, [1, 2], now=0.0)
    approx.record(B, [1], now=0.0)
    approx.remove_worker(1)
    assert approx.find_matches([1, 2], now=1.0) == {B: 1}
    assert len(approx) == 1


def test_bad_settings():
    with pytest.raises(ValueError):
        ApproxKvIndex(block_size=4, ttl=0, max_blocks=10)
