"""One weight tile's dequantize-and-dot inside the fused MoE's grouped GEMMs
(`fused_moe.py`), for each way the experts are stored: MXFP4 read as 32-bit words
(`words_dot`), converted by bit operations (`mxfp4_bf16.bits_dot`), by Triton's
`tl.dot_scaled`, byte by byte, or plain bf16 / float32 weights. Both grouped-GEMM kernels
call `tile_dot`; MX (see `fused_moe._MX`) picks the way at compile time."""

from __future__ import annotations

import triton
import triton.language as tl

from stator.engines.native.kernels.moe_gemv import e2m1_pair
from stator.engines.native.kernels.mxfp4_bf16 import bits_dot, bits_scales


@triton.jit
def words_dot(
    acc, a_ptr, a_rows, row_ok, w_ptr, s_ptr, n_idx, n_ok, k0, K, s_stride_n,
    BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """`tile_dot` for MXFP4 rows read as int32 words (K / 8 a row) and A in q-major order
    (moe_gemv.permute): position q of each word's 16-bit halves gives the values 8w + q and
    8w + q + 4 (3 integer operations for two, see moe_gemv.py), which meet A's columns
    q * K / 8 + w and (q + 4) * K / 8 + w: eight dots of BLOCK_K / 8. K need not divide by
    BLOCK_K (masked)."""
    dtype = a_ptr.dtype.element_ty
    wi = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    w_ok = wi < K // 8
    words = tl.load(w_ptr + n_idx[None, :] * (K // 8) + wi[:, None],
                    mask=w_ok[:, None] & n_ok[None, :], other=0).to(tl.uint32, bitcast=True)  # fmt: skip
    gs = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    sc = tl.load(s_ptr + n_idx[None, :] * s_stride_n + gs[:, None],
                 mask=(gs < K // 32)[:, None] & n_ok[None, :], other=0)  # fmt: skip
    scale = ((tl.minimum(sc.to(tl.int32), 240) + 14) << 23).to(tl.float32, bitcast=True)
    scale = tl.reshape(
        tl.broadcast_to(scale[:, None, :], (BLOCK_K // 32, 4, scale.shape[1])),
        (BLOCK_K // 8, scale.shape[1]),
    )
    a_at = a_ptr + a_rows[:, None] + wi[None, :]
    a_ok = row_ok[:, None] & w_ok[None, :]
    for q in tl.static_range(4):
        lo, hi = e2m1_pair(words, q)
        a_lo = tl.load(a_at + q * (K // 8), mask=a_ok, other=0.0)
        a_hi = tl.load(a_at + (q + 4) * (K // 8), mask=a_ok, other=0.0)
        acc = tl.dot(a_lo, (lo * scale).to(dtype), acc, input_precision=PRECISION)
        acc = tl.dot(a_hi, (hi * scale).to(dtype), acc, input_precision=PRECISION)
    return acc


@triton.jit
def tile_dot(
    acc, a_ptr, a_rows, row_ok, w_ptr, s_ptr, n_idx, n_ok, k0, K, stride_n, s_stride_n,
    BLOCK_K: tl.constexpr, PACKED: tl.constexpr, MX: tl.constexpr, PRECISION: tl.constexpr,
    ASM: tl.constexpr,
):  # fmt: skip
    """acc [M, N] += A[a_rows, k0:k0 + BLOCK_K] @ W[n_idx, k0:k0 + BLOCK_K]^T, W one
    expert's [N, K] (w_ptr, s_ptr already at the expert). The weight tile is loaded as
    [K, N] directly (no transpose). Packed: the low nibbles (even k) and the high nibbles
    (odd k) are two half-K dots against A's even and odd columns, so nothing is
    interleaved; each byte's scale is gathered (16 bytes share one, from cache)."""
    dtype = a_ptr.dtype.element_ty
    if PACKED and MX == 1:
        acc = words_dot(acc, a_ptr, a_rows, row_ok, w_ptr, s_ptr, n_idx, n_ok, k0, K,
                         s_stride_n, BLOCK_K, PRECISION)  # fmt: skip
    elif PACKED and MX == 3:  # acc [N, M], times 2^-OFFSET: the kernels `unscale` it
        sc = bits_scales(s_ptr, n_idx, n_ok, k0, K, s_stride_n, BLOCK_K)
        acc = bits_dot(acc, a_ptr, a_rows, row_ok, w_ptr, sc, n_idx, n_ok, k0, K, BLOCK_K,
                       PRECISION, ASM)  # fmt: skip
    elif PACKED and MX == 2:  # Triton's own MXFP4 dot (emulated on Hopper: upcast to bf16)
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + a_rows[:, None] + ks[None, :], mask=row_ok[:, None], other=0.0)
        kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        raw = tl.load(w_ptr + n_idx[None, :] * stride_n + kb[:, None], mask=n_ok[None, :], other=0)
        gs = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        sc = tl.load(s_ptr + n_idx[:, None] * s_stride_n + gs[None, :], mask=n_ok[:, None], other=0)
        acc = tl.dot_scaled(a, None, "bf16", raw, sc, "e2m1", acc)
    elif PACKED:
        kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        a_even = tl.load(a_ptr + a_rows[:, None] + 2 * kb[None, :], mask=row_ok[:, None], other=0.0)
        a_odd = tl.load(
            a_ptr + a_rows[:, None] + 2 * kb[None, :] + 1, mask=row_ok[:, None], other=0.0
        )
        raw = tl.load(w_ptr + n_idx[None, :] * stride_n + kb[:, None], mask=n_ok[None, :], other=0)
        raw = raw.to(tl.int16)
        # One scale per 32 values, loaded once and broadcast over its 16 bytes (gathered per
        # byte, the scale loads outnumbered the weight loads 16 to 1).
        gs = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        sc = tl.load(s_ptr + n_idx[None, :] * s_stride_n + gs[:, None], mask=n_ok[None, :], other=0)
        # See moe_gemv.py: fp16 bits of value * 2^-14, and 2^(s - 127 + 14) as float bits.
        scale = ((tl.minimum(sc.to(tl.int32), 240) + 14) << 23).to(tl.float32, bitcast=True)
        scale = tl.reshape(
            tl.broadcast_to(scale[:, None, :], (BLOCK_K // 32, 16, scale.shape[1])),
            (BLOCK_K // 2, scale.shape[1]),
        )
        lo = (((raw & 0x8) << 12) | ((raw & 0x7) << 9)).to(tl.float16, bitcast=True)
        hi = (((raw & 0x80) << 8) | ((raw & 0x70) << 5)).to(tl.float16, bitcast=True)
        w_lo = (lo.to(tl.float32) * scale).to(dtype)
        w_hi = (hi.to(tl.float32) * scale).to(dtype)
        acc = tl.dot(a_even, w_lo, acc, input_precision=PRECISION)
        acc = tl.dot(a_odd, w_hi, acc, input_precision=PRECISION)
    else:
        ks = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + a_rows[:, None] + ks[None, :], mask=row_ok[:, None], other=0.0)
        w = tl.load(w_ptr + n_idx[None, :] * stride_n + ks[:, None], mask=n_ok[None, :], other=0.0)
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
    return acc
