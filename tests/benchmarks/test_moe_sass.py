"""benchmarks/moe_sass.py: the fused MoE compiled for sm_90 without a GPU. The bit-wise MXFP4
GEMMs must stay spill-free and need fewer K-loop instructions per weight value than
`tl.dot_scaled`'s emulated upcast (what made them faster on the H100)."""

from __future__ import annotations

import pytest

moe_sass = pytest.importorskip("benchmarks.moe_sass")


@pytest.mark.skipif(not moe_sass.available(), reason="Triton without its NVIDIA tools")
def test_bit_wise_kernels_dequantize_in_fewer_instructions_than_dot_scaled(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    for which in ("up", "down"):
        bits = moe_sass.inspect("bits", (32, 64, 128, 4, 3), which)
        scaled = moe_sass.inspect("scaled", (64, 64, 64, 4, 3), which)
        assert bits["spill_bytes"] == 0, bits
        assert any(op.startswith("HGMMA") for op in bits["loop_opcodes"]), bits  # wgmma
        assert bits["per_value"] < 0.7 * scaled["per_value"], (bits, scaled)


@pytest.mark.skipif(not moe_sass.available(), reason="Triton without its NVIDIA tools")
def test_capped_bit_wise_tiles_fit_more_programs_an_sm_without_spilling(monkeypatch):
    """A register cap in the bit-wise tiles (fused_moe._config's sixth number) is only worth
    it where nothing spills (caps that spilled measured slower) and the up kernel then fits
    more programs on an SM than without the cap."""
    from stator.engines.native.kernels import fused_moe as fm

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    capped = [tile for _, tile in fm.BITS_CONFIGS if len(tile) > 5]
    assert capped
    for tile in capped:
        got = moe_sass.inspect("bits", tile, "up")
        free = moe_sass.inspect("bits", tile[:5], "up")
        assert got["registers"] <= tile[5] and got["spill_bytes"] == 0, got
        assert got["programs_per_sm"] > free["programs_per_sm"], (got, free)


def test_programs_per_sm_follow_registers_and_shared_memory():
    assert moe_sass.programs_per_sm(95, 41216, 4) == 5  # registers: 96 x 128 a program
    assert moe_sass.programs_per_sm(128, 41216, 4) == 4
    assert moe_sass.programs_per_sm(72, 41216, 4) == 5  # shared memory: 42 KiB a program
    assert moe_sass.programs_per_sm(32, 1024, 4) == 16  # 64 warps
