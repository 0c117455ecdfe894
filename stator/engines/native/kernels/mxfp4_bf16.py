"""MXFP4 weight tiles converted to bf16 with bit operations, for the grouped MoE GEMMs'
"bits" mode (`fused_moe.py`): no table, no float32 round trip.

An e2m1 nibble `s e1 e0 m` moved so that `e1 e0` land on a bf16's two lowest exponent bits
(7-8), `m` on its top mantissa bit (6) and `s` on its sign (15) is the value times 2^-126
exactly, the subnormal 0.5 (`e = 0, m = 1`) included: bf16's subnormals have the same
form. Read as 32-bit words (8 values, low nibble first), nibble q of both 16-bit halves
moves at once (2 shifts and 2 masks for two values; see `moe_half2.e2m1_bits`, the same
trick into fp16), giving the values 8w + q and 8w + q + 4 as a pair of bf16s. The group's
scale 2^(s - 127) is then one bf16 multiply by 2^(s - 127 + 126 - OFFSET) (exact: a power
of two); on the GPU one `mul.rn.bf16x2` for both halves, which keeps subnormals.

OFFSET: 2^(s - 1) itself would leave bf16's range for scale bytes above 128 (|w| above 12,
possible in the format), so the weights come out times 2^-OFFSET and the GEMM multiplies
its float32 accumulator back by 2^OFFSET (exact). With OFFSET 32 every scale byte up to 160
is exact, and down to 27 (values under 2^-95 may round; the float32 path caps bytes at
240). Activations times such weights stay far above float32's subnormals.

The word layout and the activations' q-major order are the "words" mode's (`moe_gemv.py`):
the tile dot is eight dots of BLOCK_K / 8 columns.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from stator.engines.native.kernels.moe_gemv import e2m1_pair

OFFSET = tl.constexpr(32)
# The scale multiply as one inline `mul.rn.bf16x2` (True) or two float32 multiplies of the
# halves (False: the interpreter's way, measured against it on the GPU).
BITS_ASM = True


@triton.jit
def e2m1_bf16_bits(w, q: tl.constexpr):
    """Values 8i + q (low half) and 8i + q + 4 (high half) of MXFP4 words w (uint32) as
    bf16 bits of the value times 2^-126, two to a uint32."""
    mag = (w << (6 - 4 * q)) if q < 2 else (w >> (4 * q - 6))
    sign = w << (12 - 4 * q)
    return (mag & 0x01C001C0) | (sign & 0x80008000)


@triton.jit
def _half_bf16(v, HIGH: tl.constexpr):
    """The low or high half of uint32 v as a bf16."""
    bits = (v >> 16) if HIGH else (v & 0xFFFF)
    return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def scale_pairs(sc):
    """Scale bytes (uint8) -> uint32 holding bf16 2^(s - 127 + 126 - OFFSET) in both halves
    (capped at the largest finite power of two)."""
    e = tl.minimum(sc.to(tl.uint32) + (126 - OFFSET), 254)
    return (e << 7) | (e << 23)


@triton.jit
def scaled_halves(w, q: tl.constexpr, scale, ASM: tl.constexpr):
    """Values 8i + q and 8i + q + 4 of MXFP4 words w, times their scales and 2^-OFFSET, as
    bf16: `scale` is `scale_pairs` (ASM) or `float_scales`, broadcast to the words."""
    if ASM:
        bits = tl.inline_asm_elementwise(
            "mul.rn.bf16x2 $0, $1, $2;", "=r,r,r", [e2m1_bf16_bits(w, q), scale],
            dtype=tl.uint32, is_pure=True, pack=1,
        )  # fmt: skip
        return _half_bf16(bits, False), _half_bf16(bits, True)
    # No PTX (the interpreter, which also multiplies bf16 as its uint16 storage and flushes
    # bf16 subnormals): the fp16 form of moe_gemv.e2m1_pair in float32; the same values.
    lo, hi = e2m1_pair(w, q)
    return (lo * scale).to(tl.bfloat16), (hi * scale).to(tl.bfloat16)


@triton.jit
def float_scales(sc):
    """Scale bytes (uint8) -> float32 2^(s - 127 + 14 - OFFSET), for `e2m1_pair`'s values
    (times 2^-14), capped as `scale_pairs`."""
    e = tl.minimum(tl.maximum(sc.to(tl.int32) + (14 - OFFSET), 1), 254 - 112)
    return (e << 23).to(tl.float32, bitcast=True)


@triton.jit
def bits_dot(
    acc, a_ptr, a_rows, row_ok, w_ptr, s_ptr, n_idx, n_ok, k0, K, s_stride_n,
    BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    """acc [M, N] += A[a_rows, k0:k0 + BLOCK_K] @ W[n_idx, k0:k0 + BLOCK_K]^T * 2^-OFFSET,
    W MXFP4 words (K / 8 a row) and A in q-major order (as `fused_moe._words_dot`). K need
    not divide by BLOCK_K (masked)."""
    dtype = a_ptr.dtype.element_ty
    wi = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    w_ok = wi < K // 8
    words = tl.load(w_ptr + n_idx[None, :] * (K // 8) + wi[:, None],
                    mask=w_ok[:, None] & n_ok[None, :], other=0).to(tl.uint32, bitcast=True)  # fmt: skip
    gs = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    sc = tl.load(s_ptr + n_idx[None, :] * s_stride_n + gs[:, None],
                 mask=(gs < K // 32)[:, None] & n_ok[None, :], other=0)  # fmt: skip
    scale = scale_pairs(sc) if ASM else float_scales(sc)
    scale = tl.reshape(
        tl.broadcast_to(scale[:, None, :], (BLOCK_K // 32, 4, scale.shape[1])),
        (BLOCK_K // 8, scale.shape[1]),
    )
    a_at = a_ptr + a_rows[:, None] + wi[None, :]
    a_ok = row_ok[:, None] & w_ok[None, :]
    for q in tl.static_range(4):
        lo, hi = scaled_halves(words, q, scale, ASM)
        a_lo = tl.load(a_at + q * (K // 8), mask=a_ok, other=0.0)
        a_hi = tl.load(a_at + (q + 4) * (K // 8), mask=a_ok, other=0.0)
        acc = tl.dot(a_lo, lo.to(dtype), acc, input_precision=PRECISION)
        acc = tl.dot(a_hi, hi.to(dtype), acc, input_precision=PRECISION)
    return acc


@triton.jit
def bits_dot_swapped(
    acc, a_ptr, a_rows, row_ok, w_ptr, s_ptr, n_idx, n_ok, k0, K, s_stride_n,
    BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    """`bits_dot` transposed: acc [N, M] += W[n_idx, k0:k0 + BLOCK_K] @ A[a_rows, ...]^T *
    2^-OFFSET. The weight is the MMA's left operand, which Hopper's wgmma takes from
    registers (the dequantized tile need not go through shared memory), and an expert's
    few rows are the MMA's N (8 to 256 in 8s) rather than rows of a 64-row tile."""
    dtype = a_ptr.dtype.element_ty
    wi = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    w_ok = wi < K // 8
    words = tl.load(w_ptr + n_idx[:, None] * (K // 8) + wi[None, :],
                    mask=n_ok[:, None] & w_ok[None, :], other=0).to(tl.uint32, bitcast=True)  # fmt: skip
    gs = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    sc = tl.load(s_ptr + n_idx[:, None] * s_stride_n + gs[None, :],
                 mask=n_ok[:, None] & (gs < K // 32)[None, :], other=0)  # fmt: skip
    scale = scale_pairs(sc) if ASM else float_scales(sc)
    scale = tl.reshape(
        tl.broadcast_to(scale[:, :, None], (scale.shape[0], BLOCK_K // 32, 4)),
        (scale.shape[0], BLOCK_K // 8),
    )
    a_at = a_ptr + a_rows[None, :] + wi[:, None]
    a_ok = w_ok[:, None] & row_ok[None, :]
    for q in tl.static_range(4):
        lo, hi = scaled_halves(words, q, scale, ASM)
        a_lo = tl.load(a_at + q * (K // 8), mask=a_ok, other=0.0)
        a_hi = tl.load(a_at + (q + 4) * (K // 8), mask=a_ok, other=0.0)
        acc = tl.dot(lo.to(dtype), a_lo, acc, input_precision=PRECISION)
        acc = tl.dot(hi.to(dtype), a_hi, acc, input_precision=PRECISION)
    return acc


@triton.jit
def bits_dot_paired(
    acc, a_ptr, a_rows, row_ok, w_ptr, s_ptr, n_idx, n_ok, k0, K, s_stride_n,
    BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    """`bits_dot_swapped` with each word's two values of position q side by side in K
    (A in "pair" order, `pair_order`): the bf16x2 product is the MMA operand's register
    as it is, four dots of BLOCK_K / 4."""
    dtype = a_ptr.dtype.element_ty
    wi = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    w_ok = wi < K // 8
    words = tl.load(w_ptr + n_idx[:, None] * (K // 8) + wi[None, :],
                    mask=n_ok[:, None] & w_ok[None, :], other=0).to(tl.uint32, bitcast=True)  # fmt: skip
    gs = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    sc = tl.load(s_ptr + n_idx[:, None] * s_stride_n + gs[None, :],
                 mask=n_ok[:, None] & (gs < K // 32)[None, :], other=0)  # fmt: skip
    scale = scale_pairs(sc) if ASM else float_scales(sc)
    scale = tl.reshape(
        tl.broadcast_to(scale[:, :, None], (scale.shape[0], BLOCK_K // 32, 4)),
        (scale.shape[0], BLOCK_K // 8),
    )
    ki = k0 // 4 + tl.arange(0, BLOCK_K // 4)  # pair-order columns of this q
    a_at = a_ptr + a_rows[None, :] + ki[:, None]
    a_ok = (ki < K // 4)[:, None] & row_ok[None, :]
    for q in tl.static_range(4):
        lo, hi = scaled_halves(words, q, scale, ASM)
        w = tl.reshape(tl.join(lo, hi), (lo.shape[0], BLOCK_K // 4))
        a = tl.load(a_at + q * (K // 4), mask=a_ok, other=0.0)
        acc = tl.dot(w.to(dtype), a, acc, input_precision=PRECISION)
    return acc


@triton.jit
def bits_dot_joined(
    acc, a_ptr, a_rows, row_ok, w_ptr, s_ptr, n_idx, n_ok, k0, K, s_stride_n,
    BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    """`bits_dot_paired` as one dot of BLOCK_K: the four positions' pairs joined, each word's
    eight values in the order 0 2 1 3 4 6 5 7 (A in `joined_order`)."""
    dtype = a_ptr.dtype.element_ty
    wi = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    w_ok = wi < K // 8
    words = tl.load(w_ptr + n_idx[:, None] * (K // 8) + wi[None, :],
                    mask=n_ok[:, None] & w_ok[None, :], other=0).to(tl.uint32, bitcast=True)  # fmt: skip
    gs = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    sc = tl.load(s_ptr + n_idx[:, None] * s_stride_n + gs[None, :],
                 mask=n_ok[:, None] & (gs < K // 32)[None, :], other=0)  # fmt: skip
    scale = scale_pairs(sc) if ASM else float_scales(sc)
    scale = tl.reshape(
        tl.broadcast_to(scale[:, :, None], (scale.shape[0], BLOCK_K // 32, 4)),
        (scale.shape[0], BLOCK_K // 8),
    )
    lo0, hi0 = scaled_halves(words, 0, scale, ASM)
    lo1, hi1 = scaled_halves(words, 1, scale, ASM)
    lo2, hi2 = scaled_halves(words, 2, scale, ASM)
    lo3, hi3 = scaled_halves(words, 3, scale, ASM)
    w = tl.join(tl.join(tl.join(lo0, hi0), tl.join(lo1, hi1)),
                tl.join(tl.join(lo2, hi2), tl.join(lo3, hi3)))  # fmt: skip
    w = tl.reshape(w, (words.shape[0], BLOCK_K))
    ks = k0 + tl.arange(0, BLOCK_K)
    a = tl.load(a_ptr + a_rows[None, :] + ks[:, None],
                mask=(ks < K)[:, None] & row_ok[None, :], other=0.0)  # fmt: skip
    return tl.dot(w.to(dtype), a, acc, input_precision=PRECISION)


@triton.jit
def unscale(acc):
    """A float32 accumulator of `bits_dot`s times 2^OFFSET (exact)."""
    return acc * (2.0**OFFSET)


def pair_order(x: torch.Tensor) -> torch.Tensor:
    """[T, K] -> [T, K] in `bits_dot_paired`'s order: value 8w + q + 4h at
    q * K / 4 + 2w + h (for each q, each word's two values side by side)."""
    tokens, k = x.shape
    out = torch.empty(tokens, 4, k // 8, 2, dtype=x.dtype, device=x.device)
    out.copy_(x.reshape(tokens, k // 8, 2, 4).permute(0, 3, 1, 2))
    return out.view(tokens, k)


def joined_order(x: torch.Tensor) -> torch.Tensor:
    """[T, K] -> [T, K] in `bits_dot_joined`'s order: values 1 and 2, 5 and 6 of every
    eight swapped."""
    tokens, k = x.shape
    return x.reshape(tokens, k // 8, 8)[:, :, _JOINED].reshape(tokens, k)


_JOINED = [0, 2, 1, 3, 4, 6, 5, 7]  # its own inverse


@triton.jit
def joined_column(n):
    """Where value n goes in joined order (`joined_order`)."""
    j = n % 8
    return n - j + tl.where((j % 4 == 1) | (j % 4 == 2), j ^ 3, j)


@triton.jit
def pair_column(n, K):
    """Where value n of a K-wide row goes in pair order (`pair_order`)."""
    return (n % 4) * (K // 4) + 2 * (n // 8) + (n % 8) // 4


def use_asm() -> bool:
    """Inline PTX (`mul.rn.bf16x2`) on the GPU unless BITS_ASM says otherwise; the
    interpreter has none."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    return BITS_ASM
