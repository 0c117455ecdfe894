"""The fused GEMV epilogues (kernels/epilogues.py) run by Triton's interpreter on the CPU in
float32: with one split and three, with and without a bias, each equals the sum kernel
followed by the unfused kernel (RoPE + KV store, residual add + RMSNorm, SiLU-and-mul),
padded rows (slot -1) included; and the GEMV's own SiLU-and-multiply epilogue."""

from __future__ import annotations

from tests.engines.native.triton_interpreter import NUMPY2_INDEX_PATCH, run_interpreted

_CHECK = (
    NUMPY2_INDEX_PATCH
    + r"""
import torch
from stator.engines.native.kernels.epilogues import add_rms_norm, qkv_rope_store, silu_mul
from stator.engines.native.kernels.elementwise import rms_norm, rope_, silu_mul as silu_ref
from stator.engines.native.kernels.gemv import GemvConfig, gemv
from stator.engines.native.kernels.store_kv import store_kv
from stator.engines.native.layers import RotaryEmbedding

torch.manual_seed(0)
hq, hkv, d, T = 4, 2, 16, 3
width = (hq + 2 * hkv) * d
rot = RotaryEmbedding(d, 64, 10000.0, None)
pos = torch.tensor([5, 0, 33])
slots = torch.tensor([7, -1, 2])
x = torch.randn(T, 40)
w = torch.randn(width, 40) * 0.1
b = torch.randn(width)
for splits, bias in ((1, None), (3, None), (3, b), (1, b)):
    cfg = GemvConfig(16, 16, splits)
    ref = gemv(x, w, cfg, bias)
    kc, vc = torch.zeros(8, 1, hkv, d), torch.zeros(8, 1, hkv, d)
    q, k, v = ref.clone().split([hq * d, hkv * d, hkv * d], -1)
    q, k, v = q.reshape(T, hq, d), k.reshape(T, hkv, d), v.reshape(T, hkv, d)
    rope_(q, k, rot.cos, rot.sin, pos)
    store_kv(k, v, kc, vc, slots)
    if splits == 1:
        parts, pb = gemv(x, w, cfg, bias), None
    else:
        parts, pb = gemv(x, w, cfg, reduce=False), bias
        assert parts.shape == (splits, T, width)
    kc2, vc2 = torch.zeros_like(kc), torch.zeros_like(vc)
    out = qkv_rope_store(parts, splits, pb, hq, hkv, rot.cos, rot.sin, pos, slots, kc2, vc2, torch.float32)
    assert torch.equal(out, torch.cat([q.flatten(1), k.flatten(1), v.flatten(1)], 1)), splits
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc), splits
    # residual add + norm
    n = 24
    w2 = torch.randn(n, 40) * 0.1
    b2 = torch.randn(n) if bias is not None else None
    nw = torch.rand(n) + 0.5
    res = torch.randn(T, n)
    y = gemv(x, w2, cfg, b2)
    r1 = res.clone()
    ref_n = rms_norm(y, nw, 1e-5, r1)
    p2 = gemv(x, w2, cfg, b2) if splits == 1 else gemv(x, w2, cfg, reduce=False)
    r2 = res.clone()
    out_n = add_rms_norm(p2, splits, None if splits == 1 else b2, r2, nw, 1e-5)
    assert torch.equal(out_n, ref_n) and torch.equal(r1, r2), splits
    # silu-mul
    w3 = torch.randn(2 * 20, 40) * 0.1
    y3 = gemv(x, w3, cfg)
    p3 = y3 if splits == 1 else gemv(x, w3, cfg, reduce=False)
    assert torch.equal(silu_mul(p3, splits, torch.float32), silu_ref(y3)), splits
    g3 = gemv(x, w3, cfg, gated=True, reduce=splits == 1)
    if splits > 1:
        g3 = silu_mul(g3, splits, torch.float32)
    assert torch.equal(g3, silu_ref(y3)), splits
print("ok")
"""
)


def test_fused_epilogues_equal_the_unfused_kernels_in_the_interpreter():
    run_interpreted(_CHECK, timeout=300)
