"""Fused mixture of experts on CUDA: sort the (token, expert) pairs by expert, then two
grouped GEMMs over those groups, with experts in bf16 or packed MXFP4.

Alignment (`moe_align.py`, one launch, no host sync, so it runs inside CUDA graphs): the
T * k pairs are sorted by local expert and each expert's run is padded to a multiple of
BLOCK_M; `block_expert[b]` names the expert of the b-th BLOCK_M rows (`local` = none: the
program exits). Pairs routed to another rank's experts are left out (their rows stay 0).
Up kernel, grid (row block, I / BLOCK_N): gate and up tiles of the same columns in one
program, + biases, clamped SwiGLU, written per pair [T * k, I]. Down kernel, grid (row
block, H / BLOCK_N): + bias, times the pair's routing weight, written per pair [T * k, H];
the k pairs of a token are summed after (`moe_combine.py`; deterministic, no atomics).
MXFP4 weights [N, K / 32, 16] bytes + [N, K / 32] scales are dequantized in registers, one
weight tile at a time (`moe_tile_dot.py`): converted to bf16 by bit operations with the
weight as the MMA's left operand (`mxfp4_bf16.py`), read as 32-bit words, byte by byte, or by
Triton's `tl.dot_scaled`, chosen by size (`mxfp4_mode`); for a few pairs (decode)
`moe_gemv.py` streams the weights, and large prefills expand them first (`moe_dequant.py`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stator.engines.native.kernels import switches
from stator.engines.native.kernels.moe_align import align
from stator.engines.native.kernels.moe_combine import combine
from stator.engines.native.kernels.moe_tile_dot import tile_dot
from stator.engines.native.kernels.mxfp4_bf16 import (
    BITS_CONFIGS,
    pair_column,
    pair_order,
    unscale,
    use_asm,
)


# num_pairs not specialized (a multiple of 16 or not): one compile per tile bucket, which the
# start-up warm-up meets (`token_boundaries`, kernel_warmup.py).
@triton.jit(do_not_specialize=["num_pairs"])
def _moe_up_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, out_ptr, sorted_ptr, block_expert_ptr,
    num_pairs, inter: tl.constexpr, hidden: tl.constexpr, stride_x, stride_e, stride_n, s_stride_e, s_stride_n,
    alpha, limit,
    TOP_K: tl.constexpr, LOCAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, PACKED: tl.constexpr, MX: tl.constexpr, PRECISION: tl.constexpr,
    ASM: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if e >= LOCAL:
        return
    pairs = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    row_ok = pairs < num_pairs
    a_rows = tl.where(row_ok, pairs // TOP_K, 0).to(tl.int64) * stride_x
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < inter
    dtype = out_ptr.dtype.element_ty
    w = w_ptr + e * stride_e
    sp = s_ptr + e * s_stride_e
    SWAPPED: tl.constexpr = PACKED and MX == 3  # bits_dot: [N, M] until the epilogue
    acc_g = tl.zeros([BLOCK_N, BLOCK_M] if SWAPPED else [BLOCK_M, BLOCK_N], tl.float32)
    acc_u = tl.zeros([BLOCK_N, BLOCK_M] if SWAPPED else [BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        acc_g = tile_dot(acc_g, x_ptr, a_rows, row_ok, w, sp, n, n_ok, k0, hidden, stride_n,
                          s_stride_n, BLOCK_K, PACKED, MX, PRECISION, ASM)  # fmt: skip
        acc_u = tile_dot(acc_u, x_ptr, a_rows, row_ok, w, sp, n + inter, n_ok, k0, hidden,
                          stride_n, s_stride_n, BLOCK_K, PACKED, MX, PRECISION, ASM)  # fmt: skip
    if SWAPPED:
        acc_g = tl.trans(unscale(acc_g))
        acc_u = tl.trans(unscale(acc_u))
    bg = tl.load(b_ptr + e * 2 * inter + n, mask=n_ok, other=0.0).to(tl.float32)
    bu = tl.load(b_ptr + e * 2 * inter + inter + n, mask=n_ok, other=0.0).to(tl.float32)
    # Rounded to the model dtype as an unfused matmul's output would be.
    gate = (acc_g + bg[None, :]).to(dtype).to(tl.float32)
    up = (acc_u + bu[None, :]).to(dtype).to(tl.float32)
    gate = tl.minimum(gate, limit)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    h = gate * tl.sigmoid(gate * alpha) * (up + 1.0)
    # The down kernel's activation order: q-major (`words_dot`), pair order (`bits_dot`).
    if PACKED and MX == 1:
        to = (n % 8) * (inter // 8) + n // 8
    elif SWAPPED:
        to = pair_column(n, inter)
    else:
        to = n
    tl.store(
        out_ptr + pairs[:, None].to(tl.int64) * inter + to[None, :],
        h.to(dtype),
        mask=row_ok[:, None] & n_ok[None, :],
    )


@triton.jit(do_not_specialize=["num_pairs"])
def _moe_down_kernel(
    h_ptr, w_ptr, s_ptr, b_ptr, route_w_ptr, out_ptr, sorted_ptr, block_expert_ptr,
    num_pairs, hidden: tl.constexpr, inter: tl.constexpr, stride_e, stride_n, s_stride_e, s_stride_n,
    LOCAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PACKED: tl.constexpr, MX: tl.constexpr, PRECISION: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if e >= LOCAL:
        return
    pairs = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    row_ok = pairs < num_pairs
    rows = tl.where(row_ok, pairs, 0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < hidden
    dtype = out_ptr.dtype.element_ty
    w = w_ptr + e * stride_e
    sp = s_ptr + e * s_stride_e
    SWAPPED: tl.constexpr = PACKED and MX == 3
    acc = tl.zeros([BLOCK_N, BLOCK_M] if SWAPPED else [BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        acc = tile_dot(acc, h_ptr, rows * inter, row_ok, w, sp, n, n_ok, k0, inter, stride_n,
                        s_stride_n, BLOCK_K, PACKED, MX, PRECISION, ASM)  # fmt: skip
    if SWAPPED:
        acc = tl.trans(unscale(acc))
    bias = tl.load(b_ptr + e * hidden + n, mask=n_ok, other=0.0).to(tl.float32)
    y = (acc + bias[None, :]).to(dtype).to(tl.float32)
    route = tl.load(route_w_ptr + rows, mask=row_ok, other=0.0)
    tl.store(
        out_ptr + rows[:, None] * hidden + n[None, :],
        (y * route[:, None]).to(dtype),
        mask=row_ok[:, None] & n_ok[None, :],
    )


# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) by the most (token, expert) pairs they serve.
# Measured on H100, 20B shapes, MXFP4, one layer as a CUDA graph (benchmarks/gpt_oss_gpu.py,
# 2026-11-27): 64 tokens 712-801 us with (16, 128, 64, 4, 3) vs 732-1,146 for the others
# tried; 256 tokens 1,536 us with it (a decode step of 256 sequences 36 ms; 55 ms with
# (32, 64, 64, 4, 3)); 2,048 tokens 7.75 ms with (128, 128, 64, 8, 3) vs 11.9-15.9 ms.
# ptxas reports register spills for these wide tiles (the up kernel holds two
# accumulators); they are still the fastest measured.
CONFIGS: list[tuple[int, tuple[int, int, int, int, int]]] = [
    (1024, (16, 128, 64, 4, 3)),
    (1 << 62, (128, 128, 64, 8, 3)),
]


# How the MXFP4 grouped GEMMs dequantize: "words" reads 32-bit words (`words_dot`, A in
# q-major order), "bytes" byte by byte, "scaled" is Triton's `tl.dot_scaled` (bf16 models
# only: it upcasts to bf16 on Hopper), "bits" converts words to bf16 by bit operations with
# the weight as the MMA's left operand (`mxfp4_bf16.py`). None: by size from MODES;
# STATOR_MXFP4_GEMM=<mode> fixes one (comparisons). H100, 20B, one layer as a CUDA graph
# (benchmarks/gpt_oss_gpu.py --parts gemm, 2026-11-28, µs): 64 tokens bits 287.1 vs words
# 322.2; 256 tokens bits 408.9 vs scaled 549.8 and words 561.9; 512 tokens bits 652.0 vs
# scaled 769.3; 2,048 tokens scaled 1,945 vs bits 2,757-3,117 (2026-11-28, first call; the
# crossover, between 2,048 and 8,192 pairs, was not measured). Before "bits" (2026-11-27):
# words up to 512 pairs, scaled above (64 tokens 414-436 words vs 497-530 scaled; 512 /
# 1,024 / 2,048 tokens scaled 1,083 / 1,498 / 2,350 against words 1,754 / 2,687 / 4,800
# and byte-wise 11,862 at 2,048).
_MX = {"bytes": 0, "words": 1, "scaled": 2, "bits": 3}
MXFP4_GEMM: str | None = switches.choice("STATOR_MXFP4_GEMM", tuple(_MX))
MODES: list[tuple[int, str]] = [(2048, "bits"), (1 << 62, "scaled")]  # (most pairs, mode)
# The table of `tl.dot_scaled` (bf16 models' packed experts). Same H100 runs, 256 tokens:
# (64, 64, 64, 4, 3) 640 us against (64, 128, 64, 4, 3) 737, (64, 128, 128, 8, 3) 762,
# (32, 128, 64, 4, 3) 838. With moe_align.py (2026-11-27, two calls): 256 tokens 558-564
# us; 512 tokens (2,048 pairs) 817-820 with (64, 64, 64, 4, 3) against 850 with (128, 64,
# 64, 4, 3) and 1,000-1,008 with (128, 128, 64, 8, 3); 2,048 tokens 1,938 with (128, 64,
# 64, 4, 3) against 2,297 and 2,303 for the other two (the crossover, between 2,048 and
# 8,192 pairs, was not measured). Gate and up as one dot of interleaved rows measured
# 9-14% slower (610 / 888 / 2,620 us at 256 / 512 / 2,048 tokens): not kept.
SCALED_CONFIGS: list[tuple[int, tuple[int, int, int, int, int]]] = [
    (1024, (64, 64, 64, 4, 3)),
    (4096, (64, 64, 64, 4, 3)),
    (1 << 62, (128, 64, 64, 4, 3)),
]
# The table of `words_dot`: BLOCK_K >= 128 (eight dots of BLOCK_K / 8 >= 16). Same runs:
# 64 tokens 412-436 us with (16, 64, 128, 4, 3) vs 447-539 for other word tiles and 605
# byte-wise; 256 tokens 758 us with (32, 64, 128, 4, 3) vs 796-1,675 and 1,086 byte-wise.
WORD_CONFIGS: list[tuple[int, tuple[int, int, int, int, int]]] = [
    (256, (16, 64, 128, 4, 3)),
    (1024, (32, 64, 128, 4, 3)),
    (1 << 62, (128, 128, 128, 8, 3)),
]
# Up to this many (token, expert) pairs the streaming kernels (moe_gemv.py) serve: a
# tensor-core tile of 16 rows would hold about one pair per expert. Same runs: 4 tokens
# 153 us streaming vs 259 grouped, 8 tokens 281 vs 279; with the fp16-pair streaming
# kernels (session 3) 138 vs 242 and 248 vs 273.
GEMV_MAX_PAIRS = 32


# The down kernel's own (BLOCK_N, BLOCK_K, warps, stages) by the most pairs, per MXFP4 mode
# ("bytes": bf16 experts too); a mode not here: the up kernel's tile serves both. BLOCK_M is
# the up kernel's (one sort serves both).
DOWN_CONFIGS: dict[str, list[tuple[int, tuple[int, ...] | None]]] = {}


def config_table(mode: str) -> list[tuple[int, tuple[int, int, int, int, int]]]:
    """The (most pairs, tile) table of an MXFP4 mode ("bytes" and bf16 experts: CONFIGS)."""
    tables = {"words": WORD_CONFIGS, "scaled": SCALED_CONFIGS, "bits": BITS_CONFIGS}
    return tables.get(mode, CONFIGS)


def mxfp4_mode(pairs: int, dtype: torch.dtype) -> str:
    """How the packed grouped GEMMs of `pairs` pairs dequantize (see MXFP4_GEMM)."""
    mode = MXFP4_GEMM or next(m for most, m in MODES if pairs <= most)
    if dtype != torch.bfloat16 and mode == "scaled":  # tl.dot_scaled takes bf16 activations
        return "words"
    if dtype == torch.float16 and mode == "bits":  # its weights times 2^-32 underflow fp16
        return "words"
    return mode


def _word_wise(mode: str) -> bool:
    """Modes reading int32 words and q-major activations (K need not divide BLOCK_K)."""
    return mode in ("words", "bits")


def _config(pairs: int, hidden: int, inter: int, mode: str) -> tuple:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps, stages, register cap or None) of the up kernel (a
    table's tile may name the cap sixth: `maxnreg`, more programs an SM for fewer registers)."""
    tile = next(c for n, c in config_table(mode) if pairs <= n)
    block_m, block_n, block_k, warps, stages = tile[:5]
    regs = tile[5] if len(tile) > 5 else None
    if mode == "bits" and block_k < 128:
        raise ValueError(f"bits tiles need BLOCK_K >= 128 (see BITS_CONFIGS): {block_k}")
    if _word_wise(mode):  # masked: K need not divide by BLOCK_K
        return block_m, block_n, block_k, warps, stages, regs
    while hidden % block_k or inter % block_k:
        block_k //= 2
    if block_k < 32:
        raise ValueError(f"fused MoE needs hidden and intermediate sizes of 32s: {hidden}, {inter}")
    return block_m, block_n, block_k, warps, stages, regs


def token_boundaries(top_k: int) -> list[int]:
    """The largest token count of each bucket where the MoE's kernels change (streaming or
    grouped, MXFP4 mode, tile, expanded): the start-up warm-up runs each and one more."""
    from stator.engines.native.kernels import moe_dequant

    limits = {GEMV_MAX_PAIRS, *(most for most, _ in MODES)}
    tables = (
        CONFIGS,
        SCALED_CONFIGS,
        WORD_CONFIGS,
        BITS_CONFIGS,
    )
    for table in (*tables, *DOWN_CONFIGS.values()):
        limits.update(most for most, _ in table)
    if moe_dequant.MIN_PAIRS:
        limits.add(moe_dequant.MIN_PAIRS - 1)
    tokens = {most // top_k for most in limits if most < 1 << 40}
    return sorted(tokens)


def _down_config(pairs: int, hidden: int, inter: int, mode: str, up: tuple) -> tuple:
    """The down kernel's (BLOCK_N, BLOCK_K, warps, stages, register cap or None) (see
    DOWN_CONFIGS; a tile there may name the cap fifth)."""
    tile = next((c for n, c in DOWN_CONFIGS.get(mode, []) if pairs <= n), None)
    if tile is None:
        return up[1:]
    block_n, block_k, warps, stages = tile[:4]
    while not _word_wise(mode) and (hidden % block_k or inter % block_k) and block_k > 32:
        block_k //= 2
    return block_n, block_k, warps, stages, tile[4] if len(tile) > 4 else None


def _cap(regs: int | None) -> dict:
    """The launch's register cap (Triton's `maxnreg`), where a tile names one."""
    return {} if regs is None else {"maxnreg": regs}


def uses_gemv(pairs: int) -> bool:
    """Whether `pairs` (token, expert) pairs run on the streaming kernels (moe_gemv.py)."""
    return pairs <= GEMV_MAX_PAIRS


def _expands(pairs: int, moe, allow_expand: bool) -> bool:
    from stator.engines.native.kernels import moe_dequant

    min_pairs = moe_dequant.MIN_PAIRS
    return allow_expand and moe.packed and bool(min_pairs) and pairs >= min_pairs


def x_layout(x: torch.Tensor, moe) -> str | None:
    """The layout fused_moe(x, ...) reads x in besides its own, which the router kernel can
    write (`moe_route.route(..., x, layout)`): "half2", the streaming kernels' fp16 pairs
    (moe_half2.py); "pair_order", the bit-wise grouped GEMMs' (mxfp4_bf16.py); else None."""
    from stator.engines.native.kernels.moe_gemv import uses_half2

    pairs = x.shape[0] * moe.top_k
    if _expands(pairs, moe, True):
        return None
    if uses_gemv(pairs):
        return "half2" if uses_half2(moe, x.dtype) else None
    if moe.packed and mxfp4_mode(pairs, x.dtype) == "bits":
        return "pair_order"
    return None


def fused_moe(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, moe, allow_expand: bool = True,
    x_as: tuple[torch.Tensor, ...] | None = None,
) -> torch.Tensor:  # fmt: skip
    """y [T, H] = sum over each token's k experts of weight * expert(x); `moe` is the
    models.moe.MoE module holding this rank's experts. `x_as`: x in `x_layout(x, moe)`
    already, as the router kernel returns it."""
    tokens, hidden = x.shape
    top_k, inter, local = ids.shape[1], moe.inter, moe.local
    pairs = tokens * top_k
    if _expands(pairs, moe, allow_expand):
        from stator.engines.native.kernels import moe_dequant

        return moe_dequant.expanded_moe(x, weights, ids, moe)
    if uses_gemv(pairs):
        from stator.engines.native.kernels.moe_gemv import moe_gemv

        return moe_gemv(x, weights, ids, moe, x_as)
    mode = mxfp4_mode(pairs, x.dtype) if moe.packed else "bytes"
    words = _word_wise(mode)
    up_tile = _config(pairs, hidden, inter, mode)
    block_m, block_n, block_k, warps, stages, up_regs = up_tile
    down_n, down_k, down_warps, down_stages, down_regs = _down_config(
        pairs, hidden, inter, mode, up_tile
    )
    # Other ranks' experts are left out by the sort (ids outside [first, first + local)).
    sorted_ids, block_expert = align(ids.reshape(-1), local, block_m, moe.first)
    num_blocks = block_expert.shape[0]
    if mode == "bits":
        x = x_as[0] if x_as is not None else pair_order(x)
    elif words:
        from stator.engines.native.kernels.moe_gemv import permute

        x = permute(x)
    if moe.packed:
        w13, s13, w2, s2 = moe.w13_blocks, moe.w13_scales, moe.w2_blocks, moe.w2_scales
        if words:
            w13, w2 = w13.view(torch.int32), w2.view(torch.int32)
        strides13 = (w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1))
        strides2 = (w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1))
    else:
        w13, w2 = moe.w13, moe.w2
        s13, s2 = w13, w2  # unused
        strides13 = (w13.stride(0), w13.stride(1), 0, 0)
        strides2 = (w2.stride(0), w2.stride(1), 0, 0)
    # float32 (tests): exact products, not tf32's 10-bit mantissa.
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    asm = mode.startswith("bits") and use_asm()
    act = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    x = x.contiguous()
    _moe_up_kernel[(num_blocks, triton.cdiv(inter, block_n))](
        x, w13, s13, moe.b13, act, sorted_ids, block_expert,
        pairs, inter, hidden, x.stride(0), *strides13, moe.alpha, moe.limit,
        TOP_K=top_k, LOCAL=local, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        PACKED=moe.packed, MX=_MX[mode], PRECISION=precision, ASM=asm, num_warps=warps,
        num_stages=stages, **_cap(up_regs),
    )  # fmt: skip
    alloc = torch.zeros if moe.tp.size > 1 else torch.empty
    out = alloc(pairs, hidden, dtype=x.dtype, device=x.device)
    _moe_down_kernel[(num_blocks, triton.cdiv(hidden, down_n))](
        act, w2, s2, moe.b2, weights.reshape(-1), out, sorted_ids, block_expert,
        pairs, hidden, inter, *strides2,
        LOCAL=local, BLOCK_M=block_m, BLOCK_N=down_n, BLOCK_K=down_k,
        PACKED=moe.packed, MX=_MX[mode], PRECISION=precision, ASM=asm,
        num_warps=down_warps, num_stages=down_stages, **_cap(down_regs),
    )  # fmt: skip
    return combine(out, top_k)
