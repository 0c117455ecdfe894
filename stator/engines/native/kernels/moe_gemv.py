"""Mixture of experts for small batches (decode): one program per token and block of output
rows streams the rows of all the token's k experts at once (a leading axis of k in every
tile, so k experts' loads are in flight together), on CUDA cores (a tensor-core tile's 16
rows would be mostly padding at one pair per expert).

Up, grid (token, I / BLOCK_N): gate and up rows of the same columns, + biases, the clamped
SwiGLU, written per pair. Down, grid (token, H / BLOCK_N): + bias, times each pair's routing
weight, summed over the token's k experts in the kernel (no separate sum; another rank's
experts count 0).

MXFP4 rows are read as 32-bit words (8 values): for each nibble position q of a 16-bit
half, `(w & mask) << shift` puts the e2m1 bits of two values at once into an fp16's
exponent and mantissa (sign to bit 15, magnitude to bits 9-11), which is the value times
2^-14 exactly, subnormals included: 3 integer operations per two values, where converting
each byte's nibbles separately took ~10 per byte. Each group of 32 values gets its scale
(one byte, 2^(s - 127), built as a float's bits) once, after its 32 products are summed.
Word w of a row holds values 8w..8w+7 and position q gives values 8w+q and 8w+q+4, so the
activations are read "q-major": value k at (k % 8) * K/8 + k // 8, where for each q the
words' values are contiguous. `permute` writes them so, and the up kernel writes its output
so for the down kernel; the word-wise grouped GEMMs (`fused_moe.py`) read the same order.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from stator.engines.native.kernels import moe_stream
from stator.engines.native.kernels.moe_half2 import (
    e2m1_bits,
    h_shift,
    half2_dots,
    half_pairs,
    pair_index,
)

# bf16: (BLOCK_N rows, BLOCK_K values per step, warps); mxfp4 and half2 (the fp16-pair
# dots, moe_half2.py): (BLOCK_N rows, groups of 32 values per step, warps). H100, 20B,
# MXFP4, batch 1, one layer as a CUDA graph, router included (benchmarks/gpt_oss_gpu.py,
# 2026-11-27, session 3): half2 (2, 8, 4) 45.0 us, (1, 16, 4) 46.8, (4, 16, 4) 50.6,
# (2, 16, 4) 51.3, (2, 32, 4) 52.8, (4, 16, 8) 62.6; float32 dots (2, 16, 4) 59.9 (session
# 2: 61.3, against (4, 8, 4) 70.5, (8, 16, 4) 72.9; the byte-wise kernels before: 110).
# In the engine's batch-1 step the half2 kernels take up 21.6 us and down 15.4 us a layer
# (1.6 and 1.2 TB/s): still short of the copy bandwidth. bf16: not swept.
# "<path>_down", where present, is the down kernel's (else the path's own serves both).
CONFIG = {"bf16": (8, 256, 4), "mxfp4": (2, 16, 4), "half2": (2, 8, 4)}
# Packed experts in a half-precision model take the fp16-pair path (moe_half2.py): None =
# then; True = also in float32 models (tests); False = never.
HALF2: bool | None = None


def permute(x: torch.Tensor) -> torch.Tensor:
    """[T, K] -> [T, K] in the MXFP4 kernels' q-major order: value k at
    (k % 8) * K / 8 + k // 8."""
    tokens, k = x.shape
    out = torch.empty(tokens, 8, k // 8, dtype=x.dtype, device=x.device)
    out.copy_(x.reshape(tokens, k // 8, 8).transpose(1, 2))
    return out.view(tokens, k)


@triton.jit
def e2m1_pair(w, q: tl.constexpr):
    """Values 8i + q and 8i + q + 4 of MXFP4 words w as float32 times 2^-14
    (moe_half2.e2m1_bits, each half converted)."""
    bits = e2m1_bits(w, q)
    lo = bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = (bits >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def _packed_dots(xp_ptr, x_off, w_ptr, s_ptr, e_off, s_e_off, rows, ok,
                 K: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr, KP: tl.constexpr,
                 SHARED_X: tl.constexpr):  # fmt: skip
    """[KP, BLOCK_N] float32: for each of a token's experts (axis 0; word offset e_off and
    scale offset s_e_off of its weight), its rows `rows` (MXFP4 words, K / 8 a row) dotted
    with q-major activations at xp_ptr + x_off ([KP] offsets, or one for all with SHARED_X).
    The next step's words and scales are loaded before this step's are used, so two steps'
    loads are in flight."""
    acc = tl.zeros([KP, BLOCK_N, G], tl.float32)
    gi = tl.arange(0, G)
    wj = gi[:, None] * 4 + tl.arange(0, 4)[None, :]  # [G, 4] word of each (group, j)
    w_rows = w_ptr + e_off[:, None, None, None] + rows[None, :, None, None] * (K // 8)
    s_rows = s_ptr + s_e_off[:, None, None] + rows[None, :, None] * (K // 32)
    okw = ok[:, :, None] & (gi < K // 32)[None, None, :]
    words = tl.load(w_rows + wj[None, None, :, :], mask=okw[:, :, :, None], other=0)
    sc = tl.load(s_rows + gi[None, None, :], mask=okw, other=0)
    for g0 in range(0, K // 32, G):
        gs = g0 + gi
        g_ok = gs < K // 32
        w = words.to(tl.uint32, bitcast=True)
        # 2^(sc - 127 + 14) as a float's bits: exponent field sc + 14, always normal
        # (sc = 255 is NaN in the format; capped instead of overflowing).
        scale = ((tl.minimum(sc.to(tl.int32), 240) + 14) << 23).to(tl.float32, bitcast=True)
        okn = ok[:, :, None] & (gs + G < K // 32)[None, None, :]
        words = tl.load(w_rows + (g0 + G) * 4 + wj[None, None, :, :], mask=okn[:, :, :, None],
                        other=0)  # fmt: skip
        sc = tl.load(s_rows + (gs + G)[None, None, :], mask=okn, other=0)
        part = tl.zeros([KP, BLOCK_N, G, 4], tl.float32)
        for q in tl.static_range(4):
            lo, hi = e2m1_pair(w, q)
            if SHARED_X:
                x_at = xp_ptr + x_off + g0 * 4 + wj
                x_ok = g_ok[:, None]
                x_lo = tl.load(x_at + q * (K // 8), mask=x_ok, other=0.0).to(tl.float32)
                x_hi = tl.load(x_at + (q + 4) * (K // 8), mask=x_ok, other=0.0).to(tl.float32)
                part += lo * x_lo[None, None, :, :] + hi * x_hi[None, None, :, :]
            else:
                x_at = xp_ptr + x_off[:, None, None] + g0 * 4 + wj[None, :, :]
                x_ok = g_ok[None, :, None]
                x_lo = tl.load(x_at + q * (K // 8), mask=x_ok, other=0.0).to(tl.float32)
                x_hi = tl.load(x_at + (q + 4) * (K // 8), mask=x_ok, other=0.0).to(tl.float32)
                part += lo * x_lo[:, None, :, :] + hi * x_hi[:, None, :, :]
        acc += tl.sum(part, axis=3) * scale
    return tl.sum(acc, axis=2)


@triton.jit
def _plain_dots(x_ptr, x_off, w_ptr, e_off, rows, ok,
                K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                KP: tl.constexpr):  # fmt: skip
    """The same for weights in the model dtype (rows of K values, x in natural order)."""
    acc = tl.zeros([KP, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        xk = tl.load(x_ptr + x_off[:, None] + ks[None, :], mask=k_ok[None, :], other=0.0)
        w = tl.load(
            w_ptr + e_off[:, None, None] + rows[None, :, None] * K + ks[None, None, :],
            mask=ok[:, :, None] & k_ok[None, None, :],
            other=0.0,
        )
        acc += tl.sum(w.to(tl.float32) * xk.to(tl.float32)[:, None, :], axis=2)
    return acc


@triton.jit
def _slots(ids_ptr, t, first, TOP_K: tl.constexpr, KP: tl.constexpr, LOCAL: tl.constexpr):
    """(slot index [KP], whether each is a real pair of this rank's, its local expert)."""
    slot = tl.arange(0, KP)
    e = tl.load(ids_ptr + t * TOP_K + slot, mask=slot < TOP_K, other=0).to(tl.int64) - first
    e_ok = (slot < TOP_K) & (e >= 0) & (e < LOCAL)
    return slot, e_ok, tl.where(e_ok, e, 0)


@triton.jit
def _up_kernel(
    x_ptr, inv_ptr, ids_ptr, w_ptr, s_ptr, b_ptr, out_ptr, first, stride_e, s_stride_e, alpha,
    limit, h_scale,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, KP: tl.constexpr,
    LOCAL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PACKED: tl.constexpr,
    HALF2: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < INTER
    slot, e_ok, e = _slots(ids_ptr, t, first, TOP_K, KP, LOCAL)
    ok = e_ok[:, None] & n_ok[None, :]
    if PACKED:
        # Gate and up rows interleaved in one tile (twice the loads in flight), split after.
        r = tl.arange(0, 2 * BLOCK_N)
        rows2 = tl.program_id(1) * BLOCK_N + r // 2 + (r % 2) * INTER
        ok2 = e_ok[:, None] & ((tl.program_id(1) * BLOCK_N + r // 2) < INTER)[None, :]
        if HALF2:  # x as fp16 pairs times 2^S (moe_half2.py), 2^-S at inv_ptr
            both = half2_dots(x_ptr, t * (HIDDEN // 2), w_ptr, s_ptr, e * stride_e,
                              e * s_stride_e, rows2, ok2, HIDDEN, 2 * BLOCK_N, BLOCK_K, KP, True,
                              ASM) * tl.load(inv_ptr + t)  # fmt: skip
        else:
            both = _packed_dots(x_ptr, t * HIDDEN, w_ptr, s_ptr, e * stride_e, e * s_stride_e,
                                rows2, ok2, HIDDEN, 2 * BLOCK_N, BLOCK_K, KP, True)  # fmt: skip
        gate, up = tl.split(tl.reshape(both, (KP, BLOCK_N, 2)))
    else:
        x_off = tl.zeros([KP], tl.int64) + t * HIDDEN
        gate = _plain_dots(x_ptr, x_off, w_ptr, e * stride_e, n, ok, HIDDEN, BLOCK_N, BLOCK_K, KP)
        up = _plain_dots(x_ptr, x_off, w_ptr, e * stride_e, n + INTER, ok, HIDDEN, BLOCK_N,
                         BLOCK_K, KP)  # fmt: skip
    dtype = b_ptr.dtype.element_ty  # the model's (out_ptr holds fp16 pairs with HALF2)
    b = b_ptr + e[:, None] * 2 * INTER + n[None, :]
    gate = gate + tl.load(b, mask=ok, other=0.0).to(tl.float32)
    up = up + tl.load(b + INTER, mask=ok, other=0.0).to(tl.float32)
    gate = tl.minimum(gate.to(dtype).to(tl.float32), limit)
    up = tl.minimum(tl.maximum(up.to(dtype).to(tl.float32), -limit), limit)
    h = (gate * tl.sigmoid(gate * alpha) * (up + 1.0)).to(dtype)
    row = (t * TOP_K + slot)[:, None] * INTER
    store_ok = (slot < TOP_K)[:, None] & n_ok[None, :]
    if HALF2:  # as the down kernel's pairs, times 2^h_shift (bounded by the clamps)
        hs = (h.to(tl.float32) * h_scale).to(tl.float16)
        tl.store(out_ptr + row + pair_index(n, INTER)[None, :], hs, mask=store_ok)
    else:  # packed: in the q-major order the down kernel's _packed_dots reads
        to = (n % 8) * (INTER // 8) + n // 8 if PACKED else n
        tl.store(out_ptr + row + to[None, :], h, mask=store_ok)


@triton.jit
def _down_kernel(
    h_ptr, ids_ptr, route_ptr, w_ptr, s_ptr, b_ptr, out_ptr, first, stride_e, s_stride_e,
    h_inv,
    HIDDEN: tl.constexpr, INTER: tl.constexpr, TOP_K: tl.constexpr, KP: tl.constexpr,
    LOCAL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PACKED: tl.constexpr,
    HALF2: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < HIDDEN
    slot, e_ok, e = _slots(ids_ptr, t, first, TOP_K, KP, LOCAL)
    ok = e_ok[:, None] & n_ok[None, :]
    h_off = (t * TOP_K + slot) * INTER
    if HALF2:
        y = half2_dots(h_ptr, h_off // 2, w_ptr, s_ptr, e * stride_e, e * s_stride_e, n, ok,
                       INTER, BLOCK_N, BLOCK_K, KP, False, ASM) * h_inv  # fmt: skip
    elif PACKED:
        y = _packed_dots(h_ptr, h_off, w_ptr, s_ptr, e * stride_e, e * s_stride_e, n, ok,
                         INTER, BLOCK_N, BLOCK_K, KP, False)  # fmt: skip
    else:
        y = _plain_dots(h_ptr, h_off, w_ptr, e * stride_e, n, ok, INTER, BLOCK_N, BLOCK_K, KP)
    dtype = out_ptr.dtype.element_ty
    bias = tl.load(b_ptr + e[:, None] * HIDDEN + n[None, :], mask=ok, other=0.0)
    y = (y + bias.to(tl.float32)).to(dtype).to(tl.float32)
    route = tl.load(route_ptr + t * TOP_K + slot, mask=slot < TOP_K, other=0.0)
    # Each pair rounded to the model dtype (as an unfused per-pair output), then summed.
    y = (y * route[:, None]).to(dtype).to(tl.float32)
    y = tl.sum(tl.where(ok, y, 0.0), axis=0)
    tl.store(out_ptr + t * HIDDEN + n, y.to(dtype), mask=n_ok)


def uses_half2(moe, dtype: torch.dtype) -> bool:
    """Whether this layer's streaming kernels take the fp16-pair path (moe_half2.py)."""
    if not moe.packed or HALF2 is False or h_shift(moe.alpha, moe.limit) is None:
        return False
    return HALF2 is True or dtype in (torch.bfloat16, torch.float16)


def moe_gemv(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, moe,
    x_pairs: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:  # fmt: skip
    """The same as fused_moe.fused_moe, for a few tokens (`x_pairs`: see fused_moe)."""
    tokens, hidden = x.shape
    top_k, inter = ids.shape[1], moe.inter
    kp = triton.next_power_of_2(top_k)
    half2 = uses_half2(moe, x.dtype)
    path = "half2" if half2 else "mxfp4" if moe.packed else "bf16"
    block_n, block_k, warps = CONFIG[path]
    down_n, down_k, down_warps = CONFIG.get(f"{path}_down", CONFIG[path])
    inv = x  # unused unless half2
    act_dtype = torch.float16 if half2 else x.dtype
    shift = h_shift(moe.alpha, moe.limit) if half2 else 0
    if moe.packed:
        w13 = moe.w13_blocks.view(torch.int32)
        w2 = moe.w2_blocks.view(torch.int32)
        s13, s2 = moe.w13_scales, moe.w2_scales
        st13 = (w13.stride(0), s13.stride(0))
        st2 = (w2.stride(0), s2.stride(0))
        if half2:
            a, inv = x_pairs if x_pairs is not None else half_pairs(x)
        else:
            a = permute(x)
    else:
        w13, w2 = moe.w13, moe.w2
        s13, s2 = w13, w2  # unused
        st13 = (w13.stride(0), 0)
        st2 = (w2.stride(0), 0)
        a = x.contiguous()
    act = torch.empty(tokens * top_k, inter, dtype=act_dtype, device=x.device)
    for w in (w13, w2, s13, s2):
        assert w.is_contiguous()
    flat_ids = ids.reshape(-1).contiguous()
    asm = os.environ.get("TRITON_INTERPRET", "0") != "1"  # the interpreter has no PTX
    if half2 and moe_stream.ENABLED:  # the row-tile kernels (moe_stream.py)
        moe_stream.up(a, inv, flat_ids, moe, act, shift, asm)
        out = torch.empty(tokens, hidden, dtype=x.dtype, device=x.device)
        moe_stream.down(act, flat_ids, weights.reshape(-1).contiguous(), moe, out, shift, asm)
        return out
    meta = dict(HIDDEN=hidden, INTER=inter, TOP_K=top_k, KP=kp, LOCAL=moe.local,
                PACKED=moe.packed, HALF2=half2, ASM=asm)  # fmt: skip
    _up_kernel[(tokens, triton.cdiv(inter, block_n))](
        a, inv, flat_ids, w13, s13, moe.b13, act, moe.first, *st13, moe.alpha, moe.limit,
        2.0**shift, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=warps, **meta,
    )  # fmt: skip
    out = torch.empty(tokens, hidden, dtype=x.dtype, device=x.device)
    _down_kernel[(tokens, triton.cdiv(hidden, down_n))](
        act.view(torch.int32) if half2 else act, flat_ids, weights.reshape(-1).contiguous(), w2, s2, moe.b2, out, moe.first, *st2,
        2.0**-shift, BLOCK_N=down_n, BLOCK_K=down_k, num_warps=down_warps, **meta,
    )  # fmt: skip
    return out
