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

The tile dot (`bits_dot`) puts the weight on the MMA's M side and the activations in "pair
order". H100, 20B, MXFP4, one MoE layer as a CUDA graph with its router (benchmarks/
gpt_oss_gpu.py --parts gemm, 2026-11-28): 256 tokens 408.9 us against 549.8 for
`tl.dot_scaled` (weight-read floor 141.3); 512 tokens 652.0 against 769.3; 64 tokens 287.1
against 322.2 word-wise. Measured and dropped (same calls): the weight as the MMA's right
operand (dequantized tiles stored to shared memory, eight dots a tile) 1,136 us at 256
tokens; as the left operand with A q-major (a PRMT per two values to pair registers) 634.
The kernels' sizes are constexprs: with runtime sizes the words and activations loaded 8
bytes at a time and the same tile took 535 us.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from stator.engines.native.kernels.moe_gemv import e2m1_pair

OFFSET = tl.constexpr(32)
# The grouped GEMMs' tiles in this mode (`fused_moe.config_table`), (BLOCK_M, BLOCK_N,
# BLOCK_K, warps, stages) by the most pairs: BLOCK_N is the MMA's M (64 a warp group, 4 warps;
# fewer warps or BLOCK_N 32: Ampere's mma.sync), BLOCK_M its N, BLOCK_K >= 128 (four dots of
# BLOCK_K / 4; with BLOCK_K 64 the mma.sync tiles (32, 32, 64, 4, 3) and (32, 64, 64, 2, 3)
# computed wrong results on the GPU, relative error 2.7, right in the interpreter: not
# understood). H100, 20B, one layer as a CUDA graph (benchmarks/gpt_oss_gpu.py --parts gemm,
# 2026-11-28), µs: 64 tokens (16, 64, 128, 2, 3) 287.1 vs (16, 128, 128, 8, 3)
# 316.9 and (16, 32, 128, 4, 3) 371.1; 256 tokens (32, 64, 128, 4, 3) 408.9 vs (32, 64,
# 256, 4, 3) 453.4, (32, 64, 128, 2, 3) 455.6, (32, 64, 128, 4, 4) 459.7, (32, 32, 128, 2,
# 3) 466.5, (16, 64, 128, 2, 3) 473.5, (32, 64, 64, 4, 3) 521.1, (64, 64, 64, 4, 3) 597.4,
# (64, 32, 128, 4, 3) 654.8, (32, 32, 128, 4, 3) 688.9, (64, 128, 128, 8, 3) 726.0;
# 512 tokens (32, 64, 128, 4, 3) 652.0 vs (64, 32, 128, 4, 3) 977.3, (32, 32, 128, 4, 3)
# 1,153; 2,048 tokens (64, 64, 64, 4, 3) 2,757 (first call, sizes not yet constexprs).
# A sixth number caps the registers (Triton's maxnreg; `fused_moe._config`): these kernels
# run as fast as the programs an SM holds allow, when the cap spills nothing. Seventh session
# (same script, two calls, µs): 512 tokens (64, 64, 128, 4, 2, 128) 572.1-576.7 (128
# registers: 4 programs an SM) vs 597.7-604.5 uncapped (142: 3) and 625.6 for (32, 64, 128,
# 4, 3); caps that spill lose: 256 tokens (32, 64, 128, 4, 2) 426.2, with 80 registers (6
# programs, 56 bytes spilled) 485.8, with 72 (7, 64 bytes) 501.5, against (32, 64, 128, 4,
# 3) 399.4 (5 programs) and (64, 64, 128, 4, 2, 128) 415.5. The down kernel takes the up
# kernel's tile: its own (64, 128, 4, 2) 407.4, capped at 72 / 64 / 96 registers 410.9 /
# 425.1 / 426.2, against 401.3 (256 tokens; 581.1 and 602.8 against 572.1 at 512).
BITS_CONFIGS: list[tuple[int, tuple[int, ...]]] = [
    (256, (16, 64, 128, 2, 3)),
    (1024, (32, 64, 128, 4, 3)),
    (4096, (64, 64, 128, 4, 2, 128)),
    (1 << 62, (64, 128, 128, 8, 3)),
]
# The scale multiply as one inline `mul.rn.bf16x2` (True) or two float32 multiplies of the
# halves (False: the interpreter's way; the GPU test holds both to the same bits).
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
    (capped at the largest finite power of two), in PTX (the GPU only): written in Triton,
    the widening let the compiler move the bytes into the MMA's register layout first and
    convert each there in ~5 operations (byte extracts, 16-bit pair min, add, mask,
    multiply); here min, add and one multiply placing e at bits 7 and 23. K loop of the up
    kernel at (32, 64, 128, 4, 3): 563 -> 524 SASS instructions (benchmarks/moe_sass.py)."""
    return tl.inline_asm_elementwise(
        f"{{ .reg .u32 t; min.u32 t, $1, {254 - (126 - OFFSET)}; add.u32 t, t, {126 - OFFSET};"
        " mul.lo.u32 $0, t, 0x800080; }",
        "=r,r", [sc.to(tl.uint32)], dtype=tl.uint32, is_pure=True, pack=1,
    )  # fmt: skip


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
def bits_scales(s_ptr, n_idx, n_ok, k0, K, s_stride_n, BLOCK_K: tl.constexpr):
    """The scale bytes [N, BLOCK_K / 32] of `bits_dot`'s tile at k0 (0 past K)."""
    gs = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    return tl.load(s_ptr + n_idx[:, None] * s_stride_n + gs[None, :],
                   mask=n_ok[:, None] & (gs < K // 32)[None, :], other=0)  # fmt: skip


@triton.jit
def bits_dot(
    acc, a_ptr, a_rows, row_ok, w_ptr, sc, n_idx, n_ok, k0, K,
    BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    """acc [N, M] += W[n_idx, k0:k0 + BLOCK_K] @ A[a_rows, k0:k0 + BLOCK_K]^T * 2^-OFFSET:
    W MXFP4 words (K / 8 a row), A in pair order (`pair_order`), acc transposed (the
    kernels transpose it once after the loop). The weight is the MMA's left operand, which
    Hopper's wgmma takes from registers (the dequantized tile skips shared memory), and an
    expert's few rows are the MMA's N (8 to 256 in 8s), not rows of a 64-row tile. Each
    word's two values of position q sit side by side in K, so the bf16x2 product is an
    operand register as it is: four dots of BLOCK_K / 4. K need not divide by BLOCK_K.
    `sc`: the tile's scale bytes (`bits_scales`). Triton's pipelining stages the words and
    activations through shared memory but loads these in the step that uses them; loaded
    one step ahead by hand (H100, 2026-11-28) the up kernel took 121 registers instead of
    95, 4 programs an SM instead of 5, and the layer at 256 tokens 441.8 us against 399.8:
    these kernels are bound by how many programs an SM holds, not by that wait."""
    dtype = a_ptr.dtype.element_ty
    wi = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    w_ok = wi < K // 8
    words = tl.load(w_ptr + n_idx[:, None] * (K // 8) + wi[None, :],
                    mask=n_ok[:, None] & w_ok[None, :], other=0).to(tl.uint32, bitcast=True)  # fmt: skip
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
def unscale(acc):
    """A float32 accumulator of `bits_dot`s times 2^OFFSET (exact)."""
    return acc * (2.0**OFFSET)


def pair_order(x: torch.Tensor) -> torch.Tensor:
    """[T, K] -> [T, K] in `bits_dot`'s order: value 8w + q + 4h at
    q * K / 4 + 2w + h (for each q, each word's two values side by side)."""
    tokens, k = x.shape
    out = torch.empty(tokens, 4, k // 8, 2, dtype=x.dtype, device=x.device)
    out.copy_(x.reshape(tokens, k // 8, 2, 4).permute(0, 3, 1, 2))
    return out.view(tokens, k)


@triton.jit
def pair_column(n, K):
    """Where value n of a K-wide row goes in pair order (`pair_order`)."""
    return (n % 4) * (K // 4) + 2 * (n // 8) + (n % 8) // 4


@triton.jit
def write_pair_order(x_ptr, out_ptr, t, K: tl.constexpr, BLOCK: tl.constexpr):
    """Row t of x [T, K] (K <= BLOCK) into row t of out in pair order (`pair_order`)."""
    n = tl.arange(0, BLOCK)
    ok = n < K
    x = tl.load(x_ptr + t * K + n, mask=ok, other=0.0)
    tl.store(out_ptr + t * K + pair_column(n, K), x, mask=ok)


def use_asm() -> bool:
    """Inline PTX (`mul.rn.bf16x2`) on the GPU unless BITS_ASM says otherwise; the
    interpreter has none."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return False
    return BITS_ASM
