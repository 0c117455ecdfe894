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
