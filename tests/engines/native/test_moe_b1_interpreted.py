"""GPT-OSS's batch-1 decode kernels (routing from the router GEMV's split-K partial sums;
the streaming MoE kernels' variants) run by Triton's interpreter on the CPU in float32,
against the unfused kernels and the PyTorch reference."""

from __future__ import annotations

from tests.engines.native.triton_interpreter import NUMPY2_INDEX_PATCH, run_interpreted

_ROUTE_CHECK = (
    NUMPY2_INDEX_PATCH
    + r"""
import torch
from stator.engines.native.kernels.gemv import GemvConfig, gemv
from stator.engines.native.kernels.moe_route import route

g = torch.Generator().manual_seed(0)
for experts, top_k, splits in ((7, 3, 3), (32, 4, 2), (6, 4, 1)):
    x = torch.randn(2, 96, generator=g)
    w = torch.randn(experts, 96, generator=g)
    b = torch.randn(experts, generator=g)
    cfg = GemvConfig(16, 32, splits)
    logits = gemv(x, w, cfg, b)  # the GEMV summing its own partials (+ bias)
    want = route(logits, top_k, x)
    if splits > 1:
        parts = gemv(x, w, cfg, reduce=False)
        got = route(parts, top_k, x, splits, b)
    else:
        got = route(logits, top_k, x, 1, None)
    for a, c in zip(got, want):
        assert torch.equal(a, c), (experts, top_k, splits)
    ref_w, ref_i = torch.topk(x @ w.T + b, top_k, dim=-1)
    assert torch.equal(got[1], ref_i), (experts, top_k, splits)
    assert torch.allclose(got[0], torch.softmax(ref_w, -1), atol=1e-5)
try:  # partial sums without their bias: refused (the rounding dtype comes from it)
    route(torch.zeros(2, 1, 7), 3, None, 2, None)
except ValueError:
    pass
else:
    raise AssertionError("partial sums without a bias were accepted")
print("ok")
"""
)


def test_routing_sums_the_router_gemv_partials_in_the_interpreter():
    run_interpreted(_ROUTE_CHECK, timeout=300)


_STREAM_CHECK = (
    NUMPY2_INDEX_PATCH
    + r"""
import dataclasses

import torch
from stator.engines.native.config import ModelSpec
from stator.engines.native.kernels import moe_gemv as mg
from stator.engines.native.kernels import moe_stream
from stator.engines.native.kernels.moe_half2 import half_pairs
from stator.engines.native.models.moe import MoE
from stator.engines.native.sharding import TPShard
from tests.engines.native.test_gpt_oss import GPT_OSS_20B


def tiny(experts, top_k, tp, hidden, inter):
    cfg = {**GPT_OSS_20B, "hidden_size": hidden, "intermediate_size": inter,
           "num_local_experts": experts, "num_experts_per_tok": top_k}
    moe = MoE(dataclasses.replace(ModelSpec.from_dicts(cfg, {}), tp=tp), True)
    with torch.no_grad():
        moe.init_dummy(torch.Generator().manual_seed(experts + top_k))
        g = torch.Generator().manual_seed(1)
        for s in (moe.w13_scales, moe.w2_scales):  # scales other than the dummy's 2^-7
            s.copy_(torch.randint(118, 131, s.shape, generator=g, dtype=torch.uint8))
        moe.router.weight.normal_(0, 0.3)
    return moe


mg.HALF2 = True  # the fp16-pair path in float32 (the interpreter's fma2 rounds as fp16)
torch.manual_seed(0)
with torch.no_grad():
    # (experts, top_k, rank, hidden, intermediate, tokens, up tile, down tile): groups of
    # 32 values per row 3 / 2 and 5 / 3 (steps past the end clamped), a padded slot (top-3),
    # another rank's experts (rank 1 of 2), rows past the end of a block (96 / 64 rows).
    cases = [(6, 4, TPShard(), 96, 64, 1, (2, 8, 4), (4, 8, 4)),
             (6, 3, TPShard(rank=1, size=2), 160, 96, 3, (4, 2, 2), (64, 2, 4)),
             (5, 3, TPShard(), 96, 64, 2, (1, 1, 1), (2, 4, 2))]
    for experts, top_k, tp, hidden, inter, tokens, up_tile, down_tile in cases:
        what = (experts, top_k, tp.size, hidden, inter, tokens)
        moe = tiny(experts, top_k, tp, hidden, inter)
        x = torch.randn(tokens, hidden) * 3.0
        w, i = moe.route(x)
        ref = moe._reference(x, w, i)
        moe_stream.ENABLED = False
        old = mg.moe_gemv(x, w, i, moe, half_pairs(x))
        moe_stream.ENABLED = True
        moe_stream.UP_CONFIG, moe_stream.DOWN_CONFIG = up_tile, down_tile
        new = mg.moe_gemv(x, w, i, moe, half_pairs(x))
        err = float((new - ref).abs().max() / ref.abs().max())
        assert err < 1e-2, ("stream vs reference", what, err)
        # the same fp16 sums as moe_gemv's own kernels (each word's 4 positions), in
        # another order of float32 adds
        diff = float((new - old).abs().max() / old.abs().max())
        assert diff < 1e-5, ("stream vs moe_gemv", what, diff)
print("ok")
"""
)


def test_row_tile_streaming_kernels_match_the_reference_in_the_interpreter():
    run_interpreted(_STREAM_CHECK, timeout=600)
