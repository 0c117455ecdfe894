"""GPT-OSS's MoE kernels (router, streaming decode kernels, grouped GEMMs byte-, word- and
bit-wise, the expanded prefill path; the one-launch expert sort) run by Triton's
interpreter on the CPU in float32, against the PyTorch reference, in tiny shapes: 5 or 6
experts, top-3 and top-4, a hidden size that no 128-value step divides, another
tensor-parallel rank's experts."""

from __future__ import annotations

from tests.engines.native.triton_interpreter import NUMPY2_INDEX_PATCH, run_interpreted

_CHECK = (
    NUMPY2_INDEX_PATCH
    + r"""
import dataclasses

import torch
from stator.engines.native import mxfp4
from stator.engines.native.config import ModelSpec
from stator.engines.native.kernels import fused_moe as fm
from stator.engines.native.kernels import moe_dequant
from stator.engines.native.kernels.moe_gemv import moe_gemv
from stator.engines.native.kernels.moe_route import route
from stator.engines.native.kernels.mxfp4_bf16 import pair_order
from stator.engines.native.models.moe import MoE
from stator.engines.native.sharding import TPShard
from tests.engines.native.test_gpt_oss import GPT_OSS_20B


def tiny(packed, experts, top_k, tp):
    cfg = {**GPT_OSS_20B, "hidden_size": 96, "intermediate_size": 64,
           "num_local_experts": experts, "num_experts_per_tok": top_k}
    moe = MoE(dataclasses.replace(ModelSpec.from_dicts(cfg, {}), tp=tp), packed)
    with torch.no_grad():
        moe.init_dummy(torch.Generator().manual_seed(experts + top_k))
        if packed:  # scales other than the dummy's one 2^-7
            g = torch.Generator().manual_seed(1)
            for s in (moe.w13_scales, moe.w2_scales):
                s.copy_(torch.randint(118, 131, s.shape, generator=g, dtype=torch.uint8))
        moe.router.weight.normal_(0, 0.3)
    return moe


def close(ours, ref, what):
    err = float((ours - ref).abs().max() / ref.abs().max())
    assert err < 1e-5, (what, err)


torch.manual_seed(0)
with torch.no_grad():
    cases = [(True, 6, 4, TPShard()), (True, 6, 3, TPShard(rank=1, size=2)),
             (False, 5, 3, TPShard()), (False, 6, 4, TPShard(rank=1, size=2))]
    for packed, experts, top_k, tp in cases:
        moe = tiny(packed, experts, top_k, tp)
        what = (packed, experts, top_k, tp.size)
        x = torch.randn(3, 96)
        w_ref, i_ref = moe.route(x)  # torch.topk on the CPU
        w, i = route(moe.router(x), top_k)
        assert torch.equal(i, i_ref), what
        assert torch.allclose(w, w_ref, atol=1e-6), what
        ref = moe._reference(x, w_ref, i_ref)
        close(moe_gemv(x, w, i, moe), ref, ("gemv",) + what)
        xs = torch.randn(40, 96)  # grouped GEMMs: pairs above GEMV_MAX_PAIRS
        ws, is_ = moe.route(xs)
        ref = moe._reference(xs, ws, is_)
        # (tl.dot_scaled: no interpreter support)
        for mode in ("words", "bytes", "bits"):
            fm.MXFP4_GEMM = mode
            close(fm.fused_moe(xs, ws, is_, moe, allow_expand=False), ref, ("gemm", mode) + what)
        if packed:  # x in pair order from the router kernel, as MoE.forward passes it
            fm.MXFP4_GEMM = "bits"
            moe_dequant.MIN_PAIRS = 0  # (the expanded path's check below sets it)
            assert fm.x_layout(xs, moe) == "pair_order", what
            *_, ordered = route(moe.router(xs), top_k, xs, x_layout="pair_order")
            assert torch.equal(ordered, pair_order(xs)), what
            ours = fm.fused_moe(xs, ws, is_, moe, allow_expand=False, x_as=(ordered,))
            close(ours, ref, ("gemm", "bits", "routed") + what)
        if packed:
            out = torch.empty(moe.local, 128, 96)
            moe_dequant.expand(moe.w13_blocks, moe.w13_scales, out)
            assert torch.equal(out, mxfp4.dequantize(moe.w13_blocks, moe.w13_scales, torch.float32))
            moe_dequant.CHUNK = 2  # a short last chunk
            moe_dequant.MIN_PAIRS = 64
            close(fm.fused_moe(xs, ws, is_, moe), ref, ("expand",) + what)
# The fp16-pair path of the streaming kernels (moe_half2.py; float32 here, so forced on):
# pairs laid out as the kernels read them, and results within fp16's rounding of the
# reference for activations of very different sizes (the per-token power-of-two scale).
from stator.engines.native.kernels import moe_gemv as mg
from stator.engines.native.kernels.moe_half2 import half_pairs

x = torch.randn(2, 96) * torch.tensor([[3.0], [1e-3]])
pairs, inv = half_pairs(x)
got = pairs.view(torch.float16).float().reshape(2, 4, 12, 2) * inv[:, None, None, None]
want = x.reshape(2, 12, 2, 4).permute(0, 3, 1, 2)  # [t, q, word, half]
assert torch.allclose(got, want, rtol=1e-3, atol=0), (got - want).abs().max()
moe = tiny(True, 6, 4, TPShard())
w, i, routed_pairs, routed_inv = route(moe.router(x), 4, x)  # the router writes them too
assert torch.equal(routed_pairs, pairs) and torch.equal(routed_inv, inv)
assert torch.equal(i, route(moe.router(x), 4)[1])
mg.HALF2 = True
with torch.no_grad():
    for (experts, top_k, tp), size in (((6, 4, TPShard()), 300.0),
                                       ((6, 3, TPShard(rank=1, size=2)), 1e-3)):
        moe = tiny(True, experts, top_k, tp)
        x = torch.randn(3, 96) * size
        w, i = moe.route(x)
        ref = moe._reference(x, w, i)
        given = half_pairs(x) if size > 1 else None  # pairs given (as the router writes them)
        ours = mg.moe_gemv(x, w, i, moe, given)
        err = float((ours - ref).abs().max() / ref.abs().max())
        assert err < 1e-2, ("half2", experts, top_k, size, err)
# The k pairs of each token summed (moe_combine.py): rows longer than one program's block,
# top-3 and top-4, against PyTorch's sum (float32: the same up to the order of 3-4 adds).
from stator.engines.native.kernels.moe_combine import BLOCK, combine

for top_k in (3, 4):
    pair_rows = torch.randn(5 * top_k, BLOCK + 76)
    want = pair_rows.view(5, top_k, -1).sum(1)
    assert torch.allclose(combine(pair_rows, top_k), want, rtol=1e-6, atol=1e-6), top_k
print("ok")
"""
)


def test_moe_kernels_match_the_reference_in_the_interpreter():
    run_interpreted(_CHECK, timeout=900)


_ALIGN_CHECK = (
    NUMPY2_INDEX_PATCH
    + r"""
import torch
from stator.engines.native.kernels.moe_align import align, align_reference

g = torch.Generator().manual_seed(0)
# (pairs, local experts, block_m): more pairs than one chunk (256 at 32 experts), an expert
# count that is no power of two, ids `local` (another rank's experts), few pairs (33, 5).
for pairs, local, block_m in ((40, 5, 16), (1100, 32, 32), (300, 7, 64), (33, 4, 16),
                              (5, 7, 16)):
    ids = torch.randint(0, local + 1, (pairs,), generator=g)
    ids[: pairs // 3] = int(ids[0])  # one expert crowded
    got, want = align(ids, local, block_m), align_reference(ids, local, block_m)
    assert torch.equal(got[0], want[0]), (pairs, local, block_m, "sorted")
    assert torch.equal(got[1], want[1]), (pairs, local, block_m, "blocks")
# The model's ids, this rank's experts [first, first + local): the same as the local ids
# with every other expert set to `local`.
for pairs, local, first, block_m in ((300, 8, 8, 16), (40, 5, 10, 16), (33, 4, 0, 32)):
    ids = torch.randint(0, 3 * local, (pairs,), generator=g)
    local_ids = ids - first
    local_ids = torch.where((local_ids >= 0) & (local_ids < local), local_ids, local)
    got, want = align(ids, local, block_m, first), align_reference(local_ids, local, block_m)
    assert torch.equal(got[0], want[0]), (pairs, local, first, "sorted")
    assert torch.equal(got[1], want[1]), (pairs, local, first, "blocks")
print("ok")
"""
)


def test_one_launch_alignment_equals_the_torch_ops_in_the_interpreter():
    """moe_align.align against align_reference, element for element."""
    run_interpreted(_ALIGN_CHECK, timeout=300)


_BF16_BITS_CHECK = r"""
import torch
import triton
import triton.language as tl
from stator.engines.native import mxfp4
from stator.engines.native.kernels.mxfp4_bf16 import e2m1_bf16_bits


@triton.jit
def bits_kernel(w_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    w = tl.load(w_ptr + i).to(tl.uint32, bitcast=True)
    for q in tl.static_range(4):
        tl.store(out_ptr + i * 4 + q, e2m1_bf16_bits(w, q).to(tl.int32, bitcast=True))


blocks = torch.arange(256, dtype=torch.uint8).reshape(16, 16)  # every byte, every nibble pair
out = torch.zeros(64 * 4, dtype=torch.int32)
bits_kernel[(1,)](blocks.view(torch.int32).reshape(-1), out, N=64)
# [word, q, half] -> value 8w + 4 * half + q; bf16 bits are the value times 2^-126
got = out.view(torch.bfloat16).double().reshape(64, 4, 2).permute(0, 2, 1).reshape(-1) * 2.0**126
want = mxfp4.dequantize(blocks, torch.full((16,), 127, dtype=torch.uint8), torch.float64)
assert torch.equal(got, want), (got - want).abs().max()
assert torch.equal(torch.signbit(got), torch.signbit(want))  # -0 stays -0
print("ok")
"""


def test_e2m1_to_bf16_bits_equal_the_mxfp4_table_in_the_interpreter():
    """mxfp4_bf16.e2m1_bf16_bits (the GPU's bit-wise conversion, before the scale) gives
    every nibble's table value times 2^-126, the subnormal 0.5 and -0 included."""
    run_interpreted(_BF16_BITS_CHECK, timeout=120)
