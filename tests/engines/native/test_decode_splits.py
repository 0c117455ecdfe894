"""The split-K decode kernel's split count (`decode_attention.num_splits_for`): programs
per SM, bounded by the sequence length and a power of two up to 32 (a constexpr each)."""

from __future__ import annotations

import pytest

from stator.engines.native.kernels import decode_attention
from stator.engines.native.kernels.decode_attention import (
    BLOCK_N,
    DecodeTile,
    num_splits_for,
    tile_for,
)

H100_SMS = 132
LONG = 131072  # a CUDA graph plans for the model's context length


def test_mid_batches_split_their_sequences_so_the_longest_does_not_set_the_step():
    # 8 KV heads, 16 programs per SM: 2,112 programs wanted.
    splits = {b: num_splits_for(b, 8, LONG, H100_SMS, 16) for b in (1, 8, 16, 24, 32, 128, 256)}
    assert splits == {1: 32, 8: 32, 16: 16, 24: 8, 32: 8, 128: 2, 256: 1}
    # Two programs per SM (the rule before): one split from 17 sequences up.
    old = {b: num_splits_for(b, 8, LONG, H100_SMS, 2) for b in (1, 8, 16, 24, 32, 256)}
    assert old == {1: 32, 8: 4, 16: 2, 24: 1, 32: 1, 256: 1}


def test_no_split_is_shorter_than_one_tile():
    assert num_splits_for(1, 8, BLOCK_N, H100_SMS, 16) == 1
    assert num_splits_for(1, 8, 2 * BLOCK_N + 1, H100_SMS, 16) == 2  # 3 tiles: a power of two
    assert num_splits_for(4, 8, 10 * BLOCK_N, H100_SMS, 16) == 8


def test_splits_are_powers_of_two_up_to_32_for_every_batch():
    for heads in (1, 8):
        for batch in range(1, 513):
            s = num_splits_for(batch, heads, LONG, H100_SMS, 16)
            assert 1 <= s <= 32 and s & (s - 1) == 0, (batch, heads, s)


def test_a_split_floor_splits_full_batches_but_no_split_is_shorter_than_a_tile():
    assert num_splits_for(256, 8, LONG, H100_SMS, 16, min_splits=2) == 2
    assert num_splits_for(128, 8, LONG, H100_SMS, 16, min_splits=2) == 2  # the rule's own 2
    assert num_splits_for(256, 8, BLOCK_N, H100_SMS, 16, min_splits=2) == 1


def test_the_tile_length_bounds_the_split_count():
    assert num_splits_for(1, 8, 128, H100_SMS, 16, block_n=32) == 4
    assert num_splits_for(1, 8, 128, H100_SMS, 16, block_n=128) == 1


def test_long_walks_of_128_wide_heads_take_the_deeper_pipeline(monkeypatch):
    monkeypatch.setattr(decode_attention, "TILE", None)
    long, short = DecodeTile(64, 4, 3, True), DecodeTile(64, 4, 2, False)
    assert [tile_for(128, s) for s in (1, 2, 4, 8, 16)] == [long] * 3 + [short] * 2
    assert tile_for(64, 1) == short  # GPT-OSS: two stages measured faster
    assert tile_for(256, 1) == short
    assert tile_for(128, 1, elem_bytes=4) == short  # float32 (tests): not measured


@pytest.mark.parametrize("splits", [1, 16])
def test_a_forced_tile_wins_and_its_length_bounds_the_splits(monkeypatch, splits):
    forced = DecodeTile(32, 2, 3, True)
    monkeypatch.setattr(decode_attention, "TILE", forced)
    assert tile_for(128, splits) == forced == tile_for(64, splits)
    assert num_splits_for(1, 8, 128, H100_SMS, 16) == 4  # 128 tokens: four 32-token tiles
