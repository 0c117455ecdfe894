"""Which MXFP4 grouped-GEMM mode `fused_moe.mxfp4_mode` picks, by pair count and model
dtype: the bit-wise GEMMs where their weights (times 2^-32) fit the dtype, never
`tl.dot_scaled` outside bf16, and a fixed mode still subject to both."""

from __future__ import annotations

import pytest
import torch

from stator.engines.native.kernels import fused_moe as fm


def test_bf16_takes_the_bit_wise_gemms_up_to_2048_pairs_then_dot_scaled():
    assert fm.mxfp4_mode(33, torch.bfloat16) == "bits"
    assert fm.mxfp4_mode(2048, torch.bfloat16) == "bits"
    assert fm.mxfp4_mode(2049, torch.bfloat16) == "scaled"


def test_float32_never_takes_dot_scaled_and_float16_never_the_bit_wise_gemms():
    assert fm.mxfp4_mode(1024, torch.float32) == "bits"
    assert fm.mxfp4_mode(8192, torch.float32) == "words"
    for pairs in (64, 1024, 8192):
        assert fm.mxfp4_mode(pairs, torch.float16) == "words"


@pytest.mark.parametrize("fixed", ["bits", "scaled", "words", "bytes"])
def test_a_fixed_mode_still_respects_the_dtype(monkeypatch, fixed):
    monkeypatch.setattr(fm, "MXFP4_GEMM", fixed)
    assert fm.mxfp4_mode(1024, torch.bfloat16) == fixed
    assert fm.mxfp4_mode(1024, torch.float16) == ("words" if fixed in ("bits", "scaled") else fixed)


def test_bit_wise_tiles_refuse_block_k_below_128(monkeypatch):
    """With BLOCK_K 64 two mma.sync tiles computed wrong results on an H100."""
    monkeypatch.setattr(fm, "BITS_CONFIGS", [(1 << 62, (32, 32, 64, 4, 3))])
    with pytest.raises(ValueError, match="BLOCK_K >= 128"):
        fm._config(1024, 2880, 2880, "bits")
    monkeypatch.setattr(fm, "BITS_CONFIGS", [(1 << 62, (32, 64, 128, 4, 3))])
    assert fm._config(1024, 2880, 2880, "bits") == (32, 64, 128, 4, 3, None)


def test_a_tiles_register_cap_reaches_the_launch(monkeypatch):
    """A tile's sixth number (the down table's fifth) caps the kernel's registers
    (Triton's maxnreg); the down kernel takes the up kernel's cap where it has no tile."""
    monkeypatch.setattr(fm, "BITS_CONFIGS", [(1 << 62, (32, 64, 128, 4, 2, 80))])
    up = fm._config(1024, 2880, 2880, "bits")
    assert up == (32, 64, 128, 4, 2, 80)
    monkeypatch.setattr(fm, "DOWN_CONFIGS", {"bits": [(256, None), (1024, (64, 128, 4, 2, 72))]})
    assert fm._down_config(1024, 2880, 2880, "bits", up) == (64, 128, 4, 2, 72)
    assert fm._down_config(200, 2880, 2880, "bits", up) == (64, 128, 4, 2, 80)
    assert fm._down_config(4096, 2880, 2880, "bits", up) == (64, 128, 4, 2, 80)
    monkeypatch.setattr(fm, "DOWN_CONFIGS", {"bits": [(1024, (64, 128, 4, 3))]})
    assert fm._down_config(1024, 2880, 2880, "bits", up) == (64, 128, 4, 3, None)
    assert fm._cap(72) == {"maxnreg": 72} and fm._cap(None) == {}
