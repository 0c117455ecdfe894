"""The streaming MoE kernels of a few tokens (moe_gemv.py) on row tiles: the fp16-pair path
(moe_half2.py) with each program's rows in a tile [groups, rows, 4 words] and one float32
accumulator a word that is summed over groups and words only after the K loop.

moe_gemv's kernels keep a 4-D tile [experts, rows, groups, 4 words] and sum each step's
products over the words, scale them per group and add them to a 3-D accumulator inside
the loop. Compiled for sm_90 (2026-11-28, `ptxas` of Triton 3.6), that loop took 153
instructions for one 16-byte load of weights a thread (38 a word), two block-wide
barriers and a shared-memory round trip (the scales' layout against the sum's), and the
down kernel loaded its weights 4 bytes at a time with shuffles for the activations. Here
a thread's words of a step are 16-byte loads; the scale multiplies each word's float32 sum
before the add, so nothing moves between threads until the end: 31 instructions a word
(20 of them the e2m1 bits and the fused multiply-adds), no barrier in the loop.

Tried and dropped (H100, 2026-11-28): each program asking L2 for its whole slab of weights
at its start (`cp.async.bulk.prefetch.L2`, one per expert's rows): one layer 44.9-45.1 us
against 39.9-40.1 without; the up and down layers' 53 MB do not fit the 50 MB L2 together.

Rows of a program (R = experts * rows): up, slot-major, a row's gate and up interleaved
(r = slot * 2 BLOCK_N + 2 j + (0 gate | 1 up)); down, slot-minor (r = j * KP + slot), so
that the warps' rows of one thread are those of one expert and share its activations.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stator.engines.native.kernels import pdl
from stator.engines.native.kernels.moe_half2 import _half, e2m1_bits, fma2, pair_index

# (BLOCK_N rows of each expert, groups of 32 values a step, warps) of the up and the down
# kernel. H100, GPT-OSS-20B, batch 1, three layers' weights cycled in one CUDA graph (one
# layer's would stay in L2), 2026-11-28: up (2, 16, 4) 20.3 us a layer (0.58 of the copy
# rate), (1, 8, 4) 22.5, (4, 8, 4) 23.6, (4, 8, 8) 25.8, (2, 8, 4) 27.0, (8, 4, 4) 31.2;
# down (2, 16, 4) 10.2 (0.58), (4, 8, 4) 13.7, (2, 8, 4) 14.9, (1, 16, 4) 15.2, (8, 8, 4)
# 17.0. The whole MoE (routing-free: pairs, up, down) 32.2 us against moe_gemv's 39.0-39.8.
UP_CONFIG = (2, 16, 4)
DOWN_CONFIG = (2, 16, 4)
# Serve the fp16-pair path (moe_gemv.uses_half2) with these kernels; False: moe_gemv's own.
ENABLED = True
# The down kernel launches with programmatic dependent launch, loading its first weights
# while the up kernel runs (sm_90; never in Triton's interpreter): one layer 40.07 / 39.86
# us against 41.07 / 40.80 without (default tiles, H100, 2026-11-28).
DOWN_PDL = True


@triton.jit
def _load(w_row, s_row, g):
    """Groups g ([G], all readable) of every row: words [G, R, 4] (16-byte loads) and scale
    bytes [G, R, 1]. Groups lead the tile's axes: the scales then get the words' thread
    layout (contiguous along g), where [R, G] put them in another and cost a shared-memory
    round trip with two barriers a step (sm_90 SASS)."""
    wc = g[:, None, None] * 4 + tl.arange(0, 4)[None, None, :]
    w = tl.load(w_row[None, :, None] + wc).to(tl.uint32, bitcast=True)
    return w, tl.load(s_row[None, :, None] + g[:, None, None])


@triton.jit
def _dot_step(acc, w, sc, x_ptr, x_row, g, K: tl.constexpr, ASM: tl.constexpr):
    """acc [G, R, 4] += words w times the activation pairs of each nibble position q (x_row
    [R] per row or [1] shared), summed as fp16 pairs over q, times the group's scale in
    float32. Groups past the row's end (g >= K / 32) meet zero activations."""
    wc = g[:, None, None] * 4 + tl.arange(0, 4)[None, None, :]
    g_ok = (g < K // 32)[:, None, None]
    part = tl.zeros(w.shape, tl.uint32)
    for q in tl.static_range(4):
        at = x_ptr + x_row[None, :, None] + q * (K // 8) + wc
        xq = tl.load(at, mask=g_ok, other=0).to(tl.uint32, bitcast=True)
        part = fma2(e2m1_bits(w, q), xq, part, ASM)
    # 2^(sc - 127 + 14) as a float's bits (sc = 255, NaN in the format, capped).
    scale = ((tl.minimum(sc.to(tl.int32), 240) + 14) << 23).to(tl.float32, bitcast=True)
    return acc + (_half(part, False) + _half(part, True)) * scale


@triton.jit
def _row_dots(x_ptr, x_row, w_row, s_row, K: tl.constexpr, R: tl.constexpr,
              G: tl.constexpr, ASM: tl.constexpr, WAIT: tl.constexpr):  # fmt: skip
    """[R] float32: each row (word offset w_row, scale offset s_row: every row readable)
    of MXFP4 words dotted with activation pairs at x_ptr + x_row ([R] pair offsets, or [1]
    shared by all rows), still times the activations' 2^S and the values' 2^-14 folded
    into the scale. The next step's words are loaded before this step's are used (two
    steps in flight); group indices past the end are clamped (readable, no masks). WAIT:
    the first step's weights are loaded before waiting for the kernel before (PDL), whose
    output the activations are."""
    groups: tl.constexpr = K // 32
    acc = tl.zeros([G, R, 4], tl.float32)
    gi = tl.arange(0, G)
    w, sc = _load(w_row, s_row, tl.minimum(gi, groups - 1))
    if WAIT:
        tl.extra.cuda.gdc_wait()
    for g0 in range(0, groups, G):
        w_now, sc_now = w, sc
        w, sc = _load(w_row, s_row, tl.minimum(g0 + G + gi, groups - 1))
        acc = _dot_step(acc, w_now, sc_now, x_ptr, x_row, g0 + gi, K, ASM)
    return tl.sum(tl.sum(acc, axis=2), axis=0)


@triton.jit
def _up_rows_kernel(
    x_ptr, inv_ptr, ids_ptr, w_ptr, s_ptr, b_ptr, out_ptr, first, stride_e, s_stride_e, alpha,
    limit, h_scale,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, KP: tl.constexpr,
    LOCAL: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr, ASM: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    if PDL:  # the down kernel may start (its weights' loads) once every program runs
        tl.extra.cuda.gdc_launch_dependents()
    t = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, KP * 2 * BLOCK_N)
    slot = r // (2 * BLOCK_N)
    n = tl.program_id(1) * BLOCK_N + (r % (2 * BLOCK_N)) // 2
    e = tl.load(ids_ptr + t * TOP_K + slot, mask=slot < TOP_K, other=0).to(tl.int64) - first
    row_ok = (slot < TOP_K) & (e >= 0) & (e < LOCAL) & (n < INTER)
    # Rows not this program's to compute read expert 0's last row (discarded): no masks.
    e = tl.where(row_ok, e, 0)
    row = tl.minimum(n, INTER - 1) + (r % 2) * INTER
    w_row = w_ptr + e * stride_e + row * (HIDDEN // 8)
    s_row = s_ptr + e * s_stride_e + row * (HIDDEN // 32)
    x_row = tl.zeros([1], tl.int64) + t * (HIDDEN // 2)
    both = _row_dots(x_ptr, x_row, w_row, s_row, HIDDEN, KP * 2 * BLOCK_N, G, ASM, False)
    both = both * tl.load(inv_ptr + t)
    gate, up = tl.split(tl.reshape(both, (KP, BLOCK_N, 2)))
    # The epilogue of moe_gemv._up_kernel: biases, the clamped SwiGLU, pairs for the down.
    kslot = tl.arange(0, KP)
    nn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ek = tl.load(ids_ptr + t * TOP_K + kslot, mask=kslot < TOP_K, other=0).to(tl.int64) - first
    ek_ok = (kslot < TOP_K) & (ek >= 0) & (ek < LOCAL)
    ok = ek_ok[:, None] & (nn < INTER)[None, :]
    b = b_ptr + tl.where(ek_ok, ek, 0)[:, None] * 2 * INTER + nn[None, :]
    dtype = b_ptr.dtype.element_ty
    gate = gate + tl.load(b, mask=ok, other=0.0).to(tl.float32)
    up = up + tl.load(b + INTER, mask=ok, other=0.0).to(tl.float32)
    gate = tl.minimum(gate.to(dtype).to(tl.float32), limit)
    up = tl.minimum(tl.maximum(up.to(dtype).to(tl.float32), -limit), limit)
    h = (gate * tl.sigmoid(gate * alpha) * (up + 1.0)).to(dtype)
    hs = (h.to(tl.float32) * h_scale).to(tl.float16)
    store_ok = (kslot < TOP_K)[:, None] & (nn < INTER)[None, :]
    at = (t * TOP_K + kslot)[:, None] * INTER + pair_index(nn, INTER)[None, :]
    tl.store(out_ptr + at, hs, mask=store_ok)


@triton.jit
def _down_rows_kernel(
    h_ptr, ids_ptr, route_ptr, w_ptr, s_ptr, b_ptr, out_ptr, first, stride_e, s_stride_e,
    h_inv,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, KP: tl.constexpr,
    LOCAL: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr, ASM: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    # With PDL nothing the up kernel writes is read before `_row_dots` waits: the ids and
    # routing weights come from the routing kernel before it, which has finished.
    t = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, BLOCK_N * KP)
    slot = r % KP
    n = tl.program_id(1) * BLOCK_N + r // KP
    e = tl.load(ids_ptr + t * TOP_K + slot, mask=slot < TOP_K, other=0).to(tl.int64) - first
    row_ok = (slot < TOP_K) & (e >= 0) & (e < LOCAL) & (n < HIDDEN)
    e = tl.where(row_ok, e, 0)
    w_row = w_ptr + e * stride_e + tl.minimum(n, HIDDEN - 1) * (INTER // 8)
    s_row = s_ptr + e * s_stride_e + tl.minimum(n, HIDDEN - 1) * (INTER // 32)
    # This pair's activations, in pairs (a padded slot reads slot 0's: discarded).
    h_row = (t * TOP_K + tl.where(slot < TOP_K, slot, 0)) * (INTER // 2)
    y = _row_dots(h_ptr, h_row, w_row, s_row, INTER, BLOCK_N * KP, G, ASM, PDL) * h_inv
    dtype = out_ptr.dtype.element_ty
    bias = tl.load(b_ptr + e * HIDDEN + n, mask=row_ok, other=0.0)
    y = tl.where(row_ok, y, 0.0)
    y = (y + bias.to(tl.float32)).to(dtype).to(tl.float32)
    route = tl.load(route_ptr + t * TOP_K + slot, mask=slot < TOP_K, other=0.0)
    # Each pair rounded to the model dtype (as an unfused per-pair output), then summed.
    y = (y * route).to(dtype).to(tl.float32)
    y = tl.sum(tl.reshape(tl.where(row_ok, y, 0.0), (BLOCK_N, KP)), axis=1)
    nn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + t * HIDDEN + nn, y.to(dtype), mask=nn < HIDDEN)


def up(x_pairs, inv, flat_ids, moe, act, shift: int, asm: bool) -> None:
    """act [T * k, I] (fp16 pairs times 2^shift) = the clamped SwiGLU of each pair's gate
    and up rows (moe_gemv._up_kernel's output)."""
    block_n, g, warps = UP_CONFIG
    tokens, top_k = inv.shape[0], flat_ids.shape[0] // inv.shape[0]
    w13 = moe.w13_blocks.view(torch.int32)
    hopper = asm and pdl.supported(act)
    _up_rows_kernel[(tokens, triton.cdiv(moe.inter, block_n))](
        x_pairs, inv, flat_ids, w13, moe.w13_scales, moe.b13, act, moe.first, w13.stride(0),
        moe.w13_scales.stride(0), moe.alpha, moe.limit, 2.0**shift,
        HIDDEN=x_pairs.shape[1] * 2, INTER=moe.inter, TOP_K=top_k,
        KP=triton.next_power_of_2(top_k), LOCAL=moe.local, BLOCK_N=block_n, G=g, ASM=asm,
        PDL=DOWN_PDL and hopper, num_warps=warps, num_stages=1,
    )  # fmt: skip


def down(act, flat_ids, route_w, moe, out, shift: int, asm: bool) -> None:
    """out [T, H] = sum over each token's pairs of route weight * (down(act) + bias)."""
    block_n, g, warps = DOWN_CONFIG
    tokens, hidden = out.shape
    top_k = flat_ids.shape[0] // tokens
    w2 = moe.w2_blocks.view(torch.int32)
    hopper = asm and pdl.supported(out)
    _down_rows_kernel[(tokens, triton.cdiv(hidden, block_n))](
        act.view(torch.int32), flat_ids, route_w, w2, moe.w2_scales, moe.b2, out, moe.first,
        w2.stride(0), moe.w2_scales.stride(0), 2.0**-shift,
        HIDDEN=hidden, INTER=moe.inter, TOP_K=top_k, KP=triton.next_power_of_2(top_k),
        LOCAL=moe.local, BLOCK_N=block_n, G=g, ASM=asm,
        PDL=DOWN_PDL and hopper, num_warps=warps, num_stages=1, launch_pdl=DOWN_PDL and hopper,
    )  # fmt: skip
