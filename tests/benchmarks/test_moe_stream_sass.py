"""benchmarks/moe_stream_sass.py: the batch-1 row-tile MoE kernels (moe_stream.py) compiled
for sm_90 without a GPU, at their default tiles, keep what made them faster than moe_gemv's
(38 instructions a word up, 52 down, two barriers a step up): no spills, no barrier in the
K loop, at most 36 instructions a 32-bit weight word."""

from __future__ import annotations

import pytest

sass = pytest.importorskip("benchmarks.moe_stream_sass")


@pytest.mark.skipif(not sass.available(), reason="Triton without its NVIDIA tools")
def test_row_tile_kernels_loop_without_barriers_in_few_instructions(monkeypatch):
    from stator.engines.native.kernels import moe_stream

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for which, tile in (("up", moe_stream.UP_CONFIG), ("down", moe_stream.DOWN_CONFIG)):
        got = sass.inspect("rows", tile, which)
        assert got["spill_bytes"] == 0, got
        assert got["barriers"] == 0, got
        assert got["per_word"] <= 36, got
