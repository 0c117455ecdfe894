"""The fused MoE's grouped GEMMs with the MXFP4 weight as the left operand ("swap AB"):
each program computes acc [BLOCK_N, BLOCK_M] = W[n, :] @ X[pairs, :]^T for BLOCK_N weight
rows of one expert and the BLOCK_M (token, expert) pairs of one of its row blocks
(`moe_align.align`), then the same epilogues as `fused_moe.py` (biases, clamped SwiGLU;
routing weight) stored transposed back to [pairs, N].

Why swap: on Hopper the tensor cores' wgmma takes its left operand from registers and its
right one from shared memory only. `fused_moe.py` dequantizes the weight as the right
operand, so each dequantized tile makes a round trip through shared memory; as the left
operand it goes from the dequantizing registers straight into the MMA. And the pairs
become the MMA's N, which may be 16 or 32 wide: at 256 decode tokens of top-4 over 32
experts an expert holds ~32 pairs, a half-empty tile of the 64 rows a left operand needs.

Two ways to dequantize: `SCALED`, Triton's `tl.dot_scaled` with the e2m1 operand on the
left (bf16 activations only; no interpreter support), or byte-wise with the fp16 bit trick
of `moe_gemv.py` (low nibbles against the even columns of X, high nibbles against the odd).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _load_xt(a_ptr, a_rows, row_ok, k0, K, BLOCK_K: tl.constexpr, SCALED: tl.constexpr):
    """X^T's columns k0 .. k0 + BLOCK_K (< K) of the rows a_rows (offsets): [BLOCK_K, M]
    whole (SCALED), else its even and odd columns [BLOCK_K / 2, M] each."""
    if SCALED:
        ks = k0 + tl.arange(0, BLOCK_K)
        ok = row_ok[None, :] & (ks < K)[:, None]
        xa = tl.load(a_ptr + a_rows[None, :] + ks[:, None], mask=ok, other=0.0)
        xb = xa
    else:
        kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        ok = row_ok[None, :] & (kb < K // 2)[:, None]
        at = a_ptr + a_rows[None, :] + 2 * kb[:, None]
        xa = tl.load(at, mask=ok, other=0.0)
        xb = tl.load(at + 1, mask=ok, other=0.0)
    return xa, xb


@triton.jit
def _w_dot(
    acc, w_ptr, s_ptr, n_idx, n_ok, xa, xb, k0, K, stride_n, s_stride_n,
    BLOCK_K: tl.constexpr, SCALED: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """acc [N, M] += W[n_idx, k0:k0 + BLOCK_K] @ X^T's tile (`_load_xt`), W one expert's
    MXFP4 rows ([N, K / 2] bytes, [N, K / 32] scales; pointers already at the expert).
    K need not divide by BLOCK_K (masked: the tile may be wider than 2,880's 64)."""
    kb = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    ok = n_ok[:, None] & (kb < K // 2)[None, :]
    raw = tl.load(w_ptr + n_idx[:, None] * stride_n + kb[None, :], mask=ok, other=0)
    gs = k0 // 32 + tl.arange(0, BLOCK_K // 32)
    ok = n_ok[:, None] & (gs < K // 32)[None, :]
    sc = tl.load(s_ptr + n_idx[:, None] * s_stride_n + gs[None, :], mask=ok, other=0)
    if SCALED:
        acc = tl.dot_scaled(raw, sc, "e2m1", xa, None, "bf16", acc)
    else:
        dtype = xa.dtype
        raw = raw.to(tl.int16)
        # fp16 bits of value * 2^-14, and 2^(s - 127 + 14) as float bits (see moe_gemv.py);
        # one scale per 16 bytes.
        scale = ((tl.minimum(sc.to(tl.int32), 240) + 14) << 23).to(tl.float32, bitcast=True)
        scale = tl.reshape(
            tl.broadcast_to(scale[:, :, None], (scale.shape[0], BLOCK_K // 32, 16)),
            (scale.shape[0], BLOCK_K // 2),
        )
        lo = (((raw & 0x8) << 12) | ((raw & 0x7) << 9)).to(tl.float16, bitcast=True)
        hi = (((raw & 0x80) << 8) | ((raw & 0x70) << 5)).to(tl.float16, bitcast=True)
        acc = tl.dot((lo.to(tl.float32) * scale).to(dtype), xa, acc, input_precision=PRECISION)
        acc = tl.dot((hi.to(tl.float32) * scale).to(dtype), xb, acc, input_precision=PRECISION)
    return acc


@triton.jit
def _up_kernel(
    x_ptr, w_ptr, s_ptr, b_ptr, out_ptr, sorted_ptr, block_expert_ptr,
    num_pairs, inter, hidden, stride_x, stride_e, stride_n, s_stride_e, s_stride_n,
    alpha, limit,
    TOP_K: tl.constexpr, LOCAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, SCALED: tl.constexpr, PRECISION: tl.constexpr,
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
    acc_g = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    acc_u = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        # X's tile is shared by gate and up.
        xa, xb = _load_xt(x_ptr, a_rows, row_ok, k0, hidden, BLOCK_K, SCALED)
        acc_g = _w_dot(acc_g, w, sp, n, n_ok, xa, xb, k0, hidden, stride_n, s_stride_n,
                       BLOCK_K, SCALED, PRECISION)  # fmt: skip
        acc_u = _w_dot(acc_u, w, sp, n + inter, n_ok, xa, xb, k0, hidden, stride_n,
                       s_stride_n, BLOCK_K, SCALED, PRECISION)  # fmt: skip
    bg = tl.load(b_ptr + e * 2 * inter + n, mask=n_ok, other=0.0).to(tl.float32)
    bu = tl.load(b_ptr + e * 2 * inter + inter + n, mask=n_ok, other=0.0).to(tl.float32)
    # Rounded to the model dtype as an unfused matmul's output would be.
    gate = (acc_g + bg[:, None]).to(dtype).to(tl.float32)
    up = (acc_u + bu[:, None]).to(dtype).to(tl.float32)
    gate = tl.minimum(gate, limit)
    up = tl.minimum(tl.maximum(up, -limit), limit)
    h = gate * tl.sigmoid(gate * alpha) * (up + 1.0)
    tl.store(
        out_ptr + pairs[None, :].to(tl.int64) * inter + n[:, None],
        h.to(dtype),
        mask=row_ok[None, :] & n_ok[:, None],
    )


@triton.jit
def _down_kernel(
    h_ptr, w_ptr, s_ptr, b_ptr, route_w_ptr, out_ptr, sorted_ptr, block_expert_ptr,
    num_pairs, hidden, inter, stride_e, stride_n, s_stride_e, s_stride_n,
    LOCAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SCALED: tl.constexpr, PRECISION: tl.constexpr,
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
    acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        xa, xb = _load_xt(h_ptr, rows * inter, row_ok, k0, inter, BLOCK_K, SCALED)
        acc = _w_dot(acc, w, sp, n, n_ok, xa, xb, k0, inter, stride_n, s_stride_n,
                     BLOCK_K, SCALED, PRECISION)  # fmt: skip
    bias = tl.load(b_ptr + e * hidden + n, mask=n_ok, other=0.0).to(tl.float32)
    y = (acc + bias[:, None]).to(dtype).to(tl.float32)
    route = tl.load(route_w_ptr + rows, mask=row_ok, other=0.0)
    tl.store(
        out_ptr + rows[None, :] * hidden + n[:, None],
        (y * route[None, :]).to(dtype),
        mask=row_ok[None, :] & n_ok[:, None],
    )


def grouped_moe(
    x: torch.Tensor, weights: torch.Tensor, sorted_ids: torch.Tensor,
    block_expert: torch.Tensor, moe, top_k: int, config: tuple[int, int, int, int, int],
    scaled: bool,
) -> torch.Tensor:  # fmt: skip
    """Per-pair outputs [T * k, H] (each times its routing weight; pairs of other ranks'
    experts 0 under tensor parallelism) of `moe`'s packed experts on x [T, H], the pairs
    sorted by `moe_align.align` with BLOCK_M = config[0]."""
    block_m, block_n, block_k, warps, stages = config
    tokens, hidden = x.shape
    pairs, inter, local = tokens * top_k, moe.inter, moe.local
    w13, s13, w2, s2 = moe.w13_blocks, moe.w13_scales, moe.w2_blocks, moe.w2_scales
    num_blocks = block_expert.shape[0]
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    x = x.contiguous()
    act = torch.empty(pairs, inter, dtype=x.dtype, device=x.device)
    _up_kernel[(num_blocks, triton.cdiv(inter, block_n))](
        x, w13, s13, moe.b13, act, sorted_ids, block_expert,
        pairs, inter, hidden, x.stride(0), w13.stride(0), w13.stride(1), s13.stride(0),
        s13.stride(1), moe.alpha, moe.limit,
        TOP_K=top_k, LOCAL=local, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        SCALED=scaled, PRECISION=precision, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    alloc = torch.zeros if moe.tp.size > 1 else torch.empty
    out = alloc(pairs, hidden, dtype=x.dtype, device=x.device)
    _down_kernel[(num_blocks, triton.cdiv(hidden, block_n))](
        act, w2, s2, moe.b2, weights.reshape(-1), out, sorted_ids, block_expert,
        pairs, hidden, inter, w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1),
        LOCAL=local, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        SCALED=scaled, PRECISION=precision, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    return out
