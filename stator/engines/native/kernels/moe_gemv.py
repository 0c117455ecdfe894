"""Mixture of experts for small batches (decode): one program per (token, expert) pair and
block of output rows streams that expert's weight rows once, on CUDA cores (no tensor-core
tile, whose 16 rows would be mostly padding at one pair per expert).

Up, grid (pair, I / BLOCK_N): gate and up rows of the same columns, + biases, the clamped
SwiGLU, written [pair, I]. Down, grid (pair, H / BLOCK_N): + bias, times the pair's
routing weight, written [pair, H] (zeros for another rank's expert). MXFP4 rows are read as
bytes: each nibble's e2m1 bits land in an fp16's exponent and mantissa (sign to bit 15,
magnitude shifted by 9), which is the value times 2^-14 exactly, subnormals included; the
scale byte s becomes 2^(s - 127 + 14) by building its float's bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# (BLOCK_N rows, BLOCK_K values per step, warps). H100, 20B, MXFP4, batch 1, one layer as a
# CUDA graph (benchmarks/gpt_oss_gpu.py, 2026-11-27): (8, 512, 4) 110 us; (4, 256, 2) 121,
# (16, 512, 4) 123, (8, 256, 4) 124, (4, 512, 4) 140. The kernels then run at ~600 GB/s
# (the nibble-to-float bit work, not memory, is the limit). bf16: not swept.
CONFIG = {"bf16": (8, 256, 4), "mxfp4": (8, 512, 4)}


@triton.jit
def _row_dot(x_ptr, w_ptr, s_ptr, rows, row_ok, K, stride_n, s_stride_n,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PACKED: tl.constexpr):  # fmt: skip
    """[BLOCK_N] float32: rows of W (from w_ptr, this expert's) dotted with x [K]."""
    # Reduced every step: a 2-D accumulator would hold BLOCK_N * BLOCK_K floats in
    # registers (~170-230 per thread measured by ptxas), starving occupancy.
    acc = tl.zeros([BLOCK_N], tl.float32)
    if PACKED:
        for b0 in range(0, K // 2, BLOCK_K // 2):
            kb = b0 + tl.arange(0, BLOCK_K // 2)
            k_ok = kb < K // 2
            xe = tl.load(x_ptr + 2 * kb, mask=k_ok, other=0.0).to(tl.float32)
            xo = tl.load(x_ptr + 2 * kb + 1, mask=k_ok, other=0.0).to(tl.float32)
            ok = row_ok[:, None] & k_ok[None, :]
            raw = tl.load(w_ptr + rows[:, None] * stride_n + kb[None, :], mask=ok, other=0)
            raw = raw.to(tl.int16)
            lo = ((raw & 0x8) << 12) | ((raw & 0x7) << 9)
            hi = ((raw & 0x80) << 8) | ((raw & 0x70) << 5)
            lo_f = lo.to(tl.float16, bitcast=True).to(tl.float32)
            hi_f = hi.to(tl.float16, bitcast=True).to(tl.float32)
            sc = tl.load(
                s_ptr + rows[:, None] * s_stride_n + (kb // 16)[None, :], mask=ok, other=0
            ).to(tl.int32)
            # 2^(sc - 127 + 14) as a float's bits: exponent field sc + 14, always normal
            # (sc = 255 is NaN in the format; capped instead of overflowing).
            scale = ((tl.minimum(sc, 240) + 14) << 23).to(tl.float32, bitcast=True)
            acc += tl.sum((lo_f * xe[None, :] + hi_f * xo[None, :]) * scale, axis=1)
    else:
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            xk = tl.load(x_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)
            ok = row_ok[:, None] & k_ok[None, :]
            w = tl.load(w_ptr + rows[:, None] * stride_n + ks[None, :], mask=ok, other=0.0)
            acc += tl.sum(w.to(tl.float32) * xk[None, :], axis=1)
    return acc


@triton.jit
def _gemv_up_kernel(
    x_ptr, ids_ptr, w_ptr, s_ptr, b_ptr, out_ptr,
    hidden, inter, first, stride_x, stride_e, stride_n, s_stride_e, s_stride_n, alpha, limit,
    TOP_K: tl.constexpr, LOCAL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PACKED: tl.constexpr,
):  # fmt: skip
    pair = tl.program_id(0)
    e = tl.load(ids_ptr + pair).to(tl.int64) - first
    if (e < 0) | (e >= LOCAL):
        return
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < inter
    x = x_ptr + (pair // TOP_K).to(tl.int64) * stride_x
    w = w_ptr + e * stride_e
    s = s_ptr + e * s_stride_e
    gate = _row_dot(x, w, s, n, n_ok, hidden, stride_n, s_stride_n, BLOCK_N, BLOCK_K, PACKED)
    up = _row_dot(x, w, s, n + inter, n_ok, hidden, stride_n, s_stride_n, BLOCK_N, BLOCK_K,
                  PACKED)  # fmt: skip
    dtype = out_ptr.dtype.element_ty
    gate = gate + tl.load(b_ptr + e * 2 * inter + n, mask=n_ok, other=0.0).to(tl.float32)
    up = up + tl.load(b_ptr + e * 2 * inter + inter + n, mask=n_ok, other=0.0).to(tl.float32)
    gate = tl.minimum(gate.to(dtype).to(tl.float32), limit)
    up = tl.minimum(tl.maximum(up.to(dtype).to(tl.float32), -limit), limit)
    h = gate * tl.sigmoid(gate * alpha) * (up + 1.0)
    tl.store(out_ptr + pair.to(tl.int64) * inter + n, h.to(dtype), mask=n_ok)


@triton.jit
def _gemv_down_kernel(
    h_ptr, ids_ptr, route_ptr, w_ptr, s_ptr, b_ptr, out_ptr,
    hidden, inter, first, stride_e, stride_n, s_stride_e, s_stride_n,
    LOCAL: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PACKED: tl.constexpr,
):  # fmt: skip
    pair = tl.program_id(0)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < hidden
    dtype = out_ptr.dtype.element_ty
    out = out_ptr + pair.to(tl.int64) * hidden + n
    e = tl.load(ids_ptr + pair).to(tl.int64) - first
    if (e < 0) | (e >= LOCAL):
        tl.store(out, tl.zeros([BLOCK_N], tl.float32).to(dtype), mask=n_ok)
        return
    h = h_ptr + pair.to(tl.int64) * inter
    y = _row_dot(h, w_ptr + e * stride_e, s_ptr + e * s_stride_e, n, n_ok, inter, stride_n,
                 s_stride_n, BLOCK_N, BLOCK_K, PACKED)  # fmt: skip
    y = (y + tl.load(b_ptr + e * hidden + n, mask=n_ok, other=0.0).to(tl.float32)).to(dtype)
    route = tl.load(route_ptr + pair)
    tl.store(out, (y.to(tl.float32) * route).to(dtype), mask=n_ok)


def moe_gemv(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, moe) -> torch.Tensor:
    """The same as fused_moe.fused_moe, for a few pairs."""
    tokens, hidden = x.shape
    top_k, inter = ids.shape[1], moe.inter
    pairs = tokens * top_k
    block_n, block_k, warps = CONFIG["mxfp4" if moe.packed else "bf16"]
    if moe.packed:
        w13, s13, w2, s2 = moe.w13_blocks, moe.w13_scales, moe.w2_blocks, moe.w2_scales
        st13 = (w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1))
        st2 = (w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1))
    else:
        w13, w2 = moe.w13, moe.w2
        s13, s2 = w13, w2  # unused
        st13 = (w13.stride(0), w13.stride(1), 0, 0)
        st2 = (w2.stride(0), w2.stride(1), 0, 0)
    flat_ids = ids.reshape(-1)
    x = x.contiguous()
    act = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    _gemv_up_kernel[(pairs, triton.cdiv(inter, block_n))](
        x, flat_ids, w13, s13, moe.b13, act, hidden, inter, moe.first, x.stride(0), *st13,
        moe.alpha, moe.limit, TOP_K=top_k, LOCAL=moe.local, BLOCK_N=block_n, BLOCK_K=block_k,
        PACKED=moe.packed, num_warps=warps,
    )  # fmt: skip
    out = torch.empty(pairs, hidden, dtype=x.dtype, device=x.device)
    _gemv_down_kernel[(pairs, triton.cdiv(hidden, block_n))](
        act, flat_ids, weights.reshape(-1), w2, s2, moe.b2, out, hidden, inter, moe.first,
        *st2, LOCAL=moe.local, BLOCK_N=block_n, BLOCK_K=block_k, PACKED=moe.packed,
        num_warps=warps,
    )  # fmt: skip
    return out.view(tokens, top_k, hidden).sum(1)
