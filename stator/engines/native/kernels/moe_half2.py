"""MXFP4 dot products in packed fp16 pairs (`fma.rn.f16x2`) for the streaming MoE kernels
(moe_gemv.py), in half-precision models.

The word trick of moe_gemv.py leaves two dequantized values (8i + q and 8i + q + 4, times
2^-14) as the two fp16 halves of one 32-bit register. The float32 path converts each half
to float32 and multiplies it apart: ~6.5 instructions a value, which at batch 1 kept the
kernels near 1 TB/s with the issue slots, not the memory, busy. Here one `fma.rn.f16x2`
multiplies both halves by a register holding the matching two activations as fp16 and adds
them to a packed accumulator: ~3.3 instructions a value. Each lane sums only the 4
products of one word (positions q = 0..3) before it is converted to float32 and summed on
in float32, so the fp16 accumulation rounds 4 terms at most.

Activations come as "pairs": for word w and position q, the 32-bit pair at q * K / 8 + w
holds x[8w + q] (low half) and x[8w + q + 4] (high half) as fp16. fp16's range is not
bf16's, so each token's x is scaled by a power of two 2^S first, S = 14 - floor(log2 max|x|)
(max |x| * 2^S < 2^15; the weights' 2^-14 puts the products near 1): nothing overflows and
nothing that matters to the sum falls to fp16's subnormals; the kernel multiplies the
float32 result by 2^-S. The SwiGLU output (the down projection's input) is bounded by the
clamps, |h| <= max(limit, 0.28 / alpha) * (limit + 1), so the up kernel writes it as pairs
with one fixed scale (`h_shift`).

Triton's interpreter has no inline assembly: there `fma2` computes the same fused
multiply-add in float32 and rounds to fp16 (the CPU tests check everything around it).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def e2m1_bits(w, q: tl.constexpr):
    """Values 8i + q and 8i + q + 4 of MXFP4 words w (uint32, values 8i..8i+7 of word i,
    low nibble first) as the two fp16 halves of a uint32, each the value times 2^-14:
    nibble q of both 16-bit halves at once, magnitude to bits 9-11 and sign to bit 15."""
    mag = w & (0x00070007 << (4 * q))
    mag = mag << (9 - 4 * q) if q < 3 else mag >> 3
    return mag | ((w & (0x00080008 << (4 * q))) << (12 - 4 * q))


@triton.jit
def _half(v, HIGH: tl.constexpr):
    """The low or high fp16 half of uint32 v, as float32."""
    bits = (v >> 16) if HIGH else (v & 0xFFFF)
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _pack(lo, hi):
    """Two float32 tensors rounded to fp16, as one uint32 (lo in the low half)."""
    lo_bits = lo.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.uint32)
    hi_bits = hi.to(tl.float16).to(tl.uint16, bitcast=True).to(tl.uint32)
    return lo_bits | (hi_bits << 16)


@triton.jit
def fma2(a, b, c, ASM: tl.constexpr):
    """a * b + c on packed fp16 pairs (uint32 tensors, broadcast)."""
    if ASM:
        return tl.inline_asm_elementwise(
            "fma.rn.f16x2 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
            dtype=tl.uint32, is_pure=True, pack=1,
        )  # fmt: skip
    lo = _half(a, False) * _half(b, False) + _half(c, False)
    hi = _half(a, True) * _half(b, True) + _half(c, True)
    return _pack(lo, hi)


@triton.jit
def half2_dots(xp_ptr, x_off, w_ptr, s_ptr, e_off, s_e_off, rows, ok,
               K: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr, KP: tl.constexpr,
               SHARED_X: tl.constexpr, ASM: tl.constexpr):  # fmt: skip
    """moe_gemv._packed_dots with activations as pairs (uint32, x_off in pairs): [KP,
    BLOCK_N] float32, still times the activations' 2^S."""
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
        scale = ((tl.minimum(sc.to(tl.int32), 240) + 14) << 23).to(tl.float32, bitcast=True)
        okn = ok[:, :, None] & (gs + G < K // 32)[None, None, :]
        words = tl.load(w_rows + (g0 + G) * 4 + wj[None, None, :, :], mask=okn[:, :, :, None],
                        other=0)  # fmt: skip
        sc = tl.load(s_rows + (gs + G)[None, None, :], mask=okn, other=0)
        part = tl.zeros([KP, BLOCK_N, G, 4], tl.uint32)
        for q in tl.static_range(4):
            if SHARED_X:
                xq = tl.load(xp_ptr + x_off + q * (K // 8) + g0 * 4 + wj, mask=g_ok[:, None],
                             other=0).to(tl.uint32, bitcast=True)  # fmt: skip
                part = fma2(e2m1_bits(w, q), xq[None, None, :, :], part, ASM)
            else:
                x_at = xp_ptr + x_off[:, None, None] + q * (K // 8) + g0 * 4 + wj[None, :, :]
                xq = tl.load(x_at, mask=g_ok[None, :, None], other=0).to(tl.uint32, bitcast=True)
                part = fma2(e2m1_bits(w, q), xq[:, None, :, :], part, ASM)
        acc += tl.sum(_half(part, False) + _half(part, True), axis=3) * scale
    return tl.sum(acc, axis=2)


@triton.jit
def pair_index(n, K: tl.constexpr):
    """Where value n of a K-vector goes among its pairs, in fp16 units."""
    return 2 * ((n % 4) * (K // 8) + n // 8) + (n % 8) // 4


@triton.jit
def write_pairs(x_ptr, out_ptr, inv_ptr, t, K: tl.constexpr, BLOCK: tl.constexpr):
    """Token t's x [K] as pairs times 2^S at out_ptr (fp16) and 2^-S at inv_ptr."""
    n = tl.arange(0, BLOCK)
    n_ok = n < K
    x = tl.load(x_ptr + t * K + n, mask=n_ok, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=0)
    # floor(log2 amax) from the float's exponent field (0 for 0: S stays in range).
    e = ((amax.to(tl.uint32, bitcast=True) >> 23) & 0xFF).to(tl.int32) - 127
    s = tl.minimum(tl.maximum(14 - e, -100), 100)
    up = ((s + 127) << 23).to(tl.float32, bitcast=True)
    tl.store(out_ptr + t * K + pair_index(n, K), (x * up).to(tl.float16), mask=n_ok)
    tl.store(inv_ptr + t, ((127 - s) << 23).to(tl.float32, bitcast=True))


@triton.jit
def _pairs_kernel(x_ptr, out_ptr, inv_ptr, K: tl.constexpr, BLOCK: tl.constexpr):
    write_pairs(x_ptr, out_ptr, inv_ptr, tl.program_id(0).to(tl.int64), K, BLOCK)


def empty_pairs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Room for x's pairs (fp16 [T, K]) and 2^-S (float32 [T])."""
    tokens, k = x.shape
    out = torch.empty(tokens, k, dtype=torch.float16, device=x.device)
    return out, torch.empty(tokens, dtype=torch.float32, device=x.device)


def half_pairs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(pairs [T, K / 2] int32, 2^-S [T] float32) of x [T, K], K a multiple of 8."""
    tokens, k = x.shape
    out, inv = empty_pairs(x)
    _pairs_kernel[(tokens,)](
        x.contiguous(), out, inv, K=k, BLOCK=triton.next_power_of_2(k), num_warps=4
    )
    return out.view(torch.int32), inv


def h_shift(alpha: float, limit: float) -> int | None:
    """The fixed power of two the SwiGLU output is scaled by as fp16 pairs (its bound
    times 2^shift stays under 2^15), or None when the clamps bound it too loosely for fp16
    (the float32 path serves)."""
    bound = max(limit, 0.2785 / alpha if alpha > 0 else math.inf) * (limit + 1)
    if not math.isfinite(bound) or bound > 1024:
        return None
    return math.floor(math.log2(2.0**15 / bound))
