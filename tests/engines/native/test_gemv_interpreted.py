"""The split-K GEMV (kernels/gemv.py) run by Triton's interpreter on the CPU in float32:
one split and several, with and without the bias it adds in the kernel (one split) or in
the kernel summing the splits."""

from __future__ import annotations

from tests.engines.native.triton_interpreter import NUMPY2_INDEX_PATCH, run_interpreted

_CHECK = (
    NUMPY2_INDEX_PATCH
    + r"""
import torch
from stator.engines.native.kernels.gemv import GemvConfig, gemv

torch.manual_seed(0)
weight = torch.randn(40, 300) * 0.1  # 40 rows: a partial last tile; 300: K not of 64s
bias = torch.randn(40)
for rows in (1, 3):
    x = torch.randn(rows, 300)
    for cfg in (GemvConfig(16, 128, 1), GemvConfig(16, 64, 3)):
        for b in (None, bias):
            ref = torch.nn.functional.linear(x, weight, b)
            out = gemv(x, weight, cfg, b)
            assert torch.allclose(out, ref, atol=1e-5), (rows, cfg, b is None)
print("ok")
"""
)


def test_gemv_with_and_without_bias_matches_linear_in_the_interpreter():
    run_interpreted(_CHECK, timeout=300)
