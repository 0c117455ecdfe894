"""Mixture of experts for 2 to ~16 tokens (decode at small batch), expert-major: each program
streams BLOCK_N rows of one routed expert's packed MXFP4 weights once, for all the (up to
MP) pairs routed to it, on CUDA cores with the fp16-pair dots of moe_half2.py.

Why: the token-major streaming kernels (moe_gemv.py) read a token's k experts per token, so
at 8 tokens an expert two tokens share is read twice and the layer costs ~5x one token's
(246 against 45 us on an H100); the grouped GEMMs' 16-row tensor-core tiles are mostly
padding there. Expert-major reads each routed expert once: at 8 tokens ~20 of 32 experts.

The pairs are sorted by expert (`moe_align.align`, block size MP: an expert with more than
MP pairs takes several blocks, each streaming its weights again); at most `pairs` blocks
hold any (the others are past the last expert's and exit), so the grid's first axis is
min(blocks, pairs). Up, grid (block, I / BLOCK_N): gate and up rows of the same columns,
+ biases, clamped SwiGLU, written per pair as the down kernel's fp16 pairs (times
2^h_shift). Down, grid (block, H / BLOCK_N): + bias, times the pair's routing weight,
rounded to the model dtype per pair and written per pair; a token's k pairs are summed
after in float32 (as moe_gemv's down kernel sums them: the same rounding).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from stator.engines.native.kernels.moe_align import align, num_blocks
from stator.engines.native.kernels.moe_half2 import (
    _half,
    e2m1_bits,
    fma2,
    h_shift,
    half_pairs,
    pair_index,
)

# (MP pairs a block, BLOCK_N rows, groups of 32 values a step, warps) for the up and the down
# kernel (MP shared: one sort serves both). Not yet measured on a GPU: the token-major
# kernels' winner (2, 8, 4) with MP = 4.
CONFIG = {"up": (4, 2, 8, 4), "down": (4, 2, 8, 4)}


@triton.jit
def _expert_dots(xp_ptr, x_off, p_ok, w_ptr, s_ptr, rows, ok,
                 K: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr, MP: tl.constexpr,
                 ASM: tl.constexpr):  # fmt: skip
    """[MP, BLOCK_N] float32: one expert's rows `rows` (MXFP4 words at w_ptr, K / 8 a row;
    scales at s_ptr) dotted with MP pairs' activations (fp16 pairs at xp_ptr + x_off, in
    pairs), still times the activations' scale. The weights are loaded once for all MP
    pairs, the next step's before this step's are used."""
    acc = tl.zeros([MP, BLOCK_N, G], tl.float32)
    gi = tl.arange(0, G)
    wj = gi[:, None] * 4 + tl.arange(0, 4)[None, :]  # [G, 4] word of each (group, j)
    w_rows = w_ptr + rows[:, None, None] * (K // 8)
    s_rows = s_ptr + rows[:, None] * (K // 32)
    okw = ok[:, None] & (gi < K // 32)[None, :]
    words = tl.load(w_rows + wj[None, :, :], mask=okw[:, :, None], other=0)
    sc = tl.load(s_rows + gi[None, :], mask=okw, other=0)
    for g0 in range(0, K // 32, G):
        gs = g0 + gi
        g_ok = gs < K // 32
        w = words.to(tl.uint32, bitcast=True)
        scale = ((tl.minimum(sc.to(tl.int32), 240) + 14) << 23).to(tl.float32, bitcast=True)
        okn = ok[:, None] & (gs + G < K // 32)[None, :]
        words = tl.load(w_rows + (g0 + G) * 4 + wj[None, :, :], mask=okn[:, :, None], other=0)
        sc = tl.load(s_rows + (gs + G)[None, :], mask=okn, other=0)
        part = tl.zeros([MP, BLOCK_N, G, 4], tl.uint32)
        x_ok = p_ok[:, None, None] & g_ok[None, :, None]
        for q in tl.static_range(4):
            x_at = xp_ptr + x_off[:, None, None] + q * (K // 8) + g0 * 4 + wj[None, :, :]
            xq = tl.load(x_at, mask=x_ok, other=0).to(tl.uint32, bitcast=True)
            part = fma2(e2m1_bits(w, q)[None, :, :, :], xq[:, None, :, :], part, ASM)
        acc += tl.sum(_half(part, False) + _half(part, True), axis=3) * scale[None, :, :]
    return tl.sum(acc, axis=2)


@triton.jit
def _block(sorted_ptr, block_expert_ptr, num_pairs, MP: tl.constexpr):
    """(expert, pair ids [MP], which are real pairs) of this program's block."""
    b = tl.program_id(0)
    e = tl.load(block_expert_ptr + b).to(tl.int64)
    pairs = tl.load(sorted_ptr + b * MP + tl.arange(0, MP))
    p_ok = pairs < num_pairs
    return e, tl.where(p_ok, pairs, 0).to(tl.int64), p_ok


@triton.jit(do_not_specialize=["num_pairs"])
def _up_kernel(
    xp_ptr, inv_ptr, sorted_ptr, block_expert_ptr, w_ptr, s_ptr, b_ptr, out_ptr, num_pairs,
    stride_e, s_stride_e, alpha, limit, h_scale,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, LOCAL: tl.constexpr,
    MP: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    e, pairs, p_ok = _block(sorted_ptr, block_expert_ptr, num_pairs, MP)
    if e >= LOCAL:
        return
    t = pairs // TOP_K
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < INTER
    # Gate and up rows interleaved in one tile (twice the loads in flight), split after.
    r = tl.arange(0, 2 * BLOCK_N)
    rows2 = tl.program_id(1) * BLOCK_N + r // 2 + (r % 2) * INTER
    ok2 = (tl.program_id(1) * BLOCK_N + r // 2) < INTER
    both = _expert_dots(xp_ptr, t * (HIDDEN // 2), p_ok, w_ptr + e * stride_e,
                        s_ptr + e * s_stride_e, rows2, ok2, HIDDEN, 2 * BLOCK_N, G, MP, ASM)  # fmt: skip
    both = both * tl.load(inv_ptr + t, mask=p_ok, other=0.0)[:, None]
    gate, up = tl.split(tl.reshape(both, (MP, BLOCK_N, 2)))
    dtype = b_ptr.dtype.element_ty
    b = b_ptr + e * 2 * INTER + n
    gate = gate + tl.load(b, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    up = up + tl.load(b + INTER, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    gate = tl.minimum(gate.to(dtype).to(tl.float32), limit)
    up = tl.minimum(tl.maximum(up.to(dtype).to(tl.float32), -limit), limit)
    h = (gate * tl.sigmoid(gate * alpha) * (up + 1.0)).to(dtype)
    hs = (h.to(tl.float32) * h_scale).to(tl.float16)
    out = out_ptr + pairs[:, None] * INTER + pair_index(n, INTER)[None, :]
    tl.store(out, hs, mask=p_ok[:, None] & n_ok[None, :])


@triton.jit(do_not_specialize=["num_pairs"])
def _down_kernel(
    h_ptr, sorted_ptr, block_expert_ptr, route_ptr, w_ptr, s_ptr, b_ptr, out_ptr, num_pairs,
    stride_e, s_stride_e, h_inv,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, LOCAL: tl.constexpr, MP: tl.constexpr,
    BLOCK_N: tl.constexpr, G: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    e, pairs, p_ok = _block(sorted_ptr, block_expert_ptr, num_pairs, MP)
    if e >= LOCAL:
        return
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < HIDDEN
    y = _expert_dots(h_ptr, pairs * (INTER // 2), p_ok, w_ptr + e * stride_e,
                     s_ptr + e * s_stride_e, n, n_ok, INTER, BLOCK_N, G, MP, ASM) * h_inv  # fmt: skip
    dtype = out_ptr.dtype.element_ty
    bias = tl.load(b_ptr + e * HIDDEN + n, mask=n_ok, other=0.0).to(tl.float32)
    y = (y + bias[None, :]).to(dtype).to(tl.float32)
    route = tl.load(route_ptr + pairs, mask=p_ok, other=0.0)
    out = out_ptr + pairs[:, None] * HIDDEN + n[None, :]
    tl.store(out, (y * route[:, None]).to(dtype), mask=p_ok[:, None] & n_ok[None, :])


def expert_gemv(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, moe,
    x_pairs: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:  # fmt: skip
    """The same as moe_gemv.moe_gemv for packed experts on the fp16-pair path
    (`moe_gemv.uses_half2`)."""
    tokens, hidden = x.shape
    top_k, inter, local = ids.shape[1], moe.inter, moe.local
    pairs = tokens * top_k
    shift = h_shift(moe.alpha, moe.limit)
    assert moe.packed and shift is not None
    mp, bn_up, g_up, warps_up = CONFIG["up"]
    _, bn_down, g_down, warps_down = CONFIG["down"]
    local_ids = (ids.reshape(-1) - moe.first).long()
    if moe.tp.size > 1:
        local_ids = torch.where((local_ids >= 0) & (local_ids < local), local_ids, local)
    sorted_ids, block_expert = align(local_ids, local, mp)
    grid0 = min(num_blocks(pairs, local, mp), pairs)  # blocks past these hold no pair
    xp, inv = x_pairs if x_pairs is not None else half_pairs(x)
    w13, w2 = moe.w13_blocks.view(torch.int32), moe.w2_blocks.view(torch.int32)
    s13, s2 = moe.w13_scales, moe.w2_scales
    for w in (w13, w2, s13, s2):
        assert w.is_contiguous()
    asm = os.environ.get("TRITON_INTERPRET", "0") != "1"  # the interpreter has no PTX
    act = torch.empty(pairs, inter, dtype=torch.float16, device=x.device)
    _up_kernel[(grid0, triton.cdiv(inter, bn_up))](
        xp, inv, sorted_ids, block_expert, w13, s13, moe.b13, act, pairs, w13.stride(0),
        s13.stride(0), moe.alpha, moe.limit, 2.0**shift,
        HIDDEN=hidden, INTER=inter, TOP_K=top_k, LOCAL=local, MP=mp, BLOCK_N=bn_up, G=g_up,
        ASM=asm, num_warps=warps_up,
    )  # fmt: skip
    alloc = torch.zeros if moe.tp.size > 1 else torch.empty  # other ranks' pairs: 0
    out = alloc(pairs, hidden, dtype=x.dtype, device=x.device)
    _down_kernel[(grid0, triton.cdiv(hidden, bn_down))](
        act.view(torch.int32), sorted_ids, block_expert, weights.reshape(-1).contiguous(), w2,
        s2, moe.b2, out, pairs, w2.stride(0), s2.stride(0), 2.0**-shift,
        HIDDEN=hidden, INTER=inter, LOCAL=local, MP=mp, BLOCK_N=bn_down, G=g_down, ASM=asm,
        num_warps=warps_down,
    )  # fmt: skip
    return out.view(tokens, top_k, hidden).sum(1, dtype=torch.float32).to(x.dtype)
