"""A projection's output finished inside the kernel that consumes it.

At batch 1 a decode step is ~400 kernels, and each costs a few microseconds beyond its
bytes. The split-K GEMV (`gemv.py`) ends with a kernel that sums its float32 partials;
here the consumer of each projection sums them itself, so that kernel and the consumer's
own launch become one:

- q/k/v -> RoPE on q and k, and k, v written into the paged cache (was: sum, RoPE, store);
- o (and down) -> the residual add and the next RMSNorm (was: sum, fused add + norm);
- gate/up -> SiLU(gate) * up (was: sum, SiLU-and-multiply).

The input is either `splits` float32 partial sums [S, M, N] (plus the bias, added after the
sum) or, with one split, the finished output [M, N] (cuBLAS's, or the GEMV's own). Numerics
equal the unfused kernels': the sum is rounded to the output dtype first, then each op
rounds where its unfused kernel does (`elementwise.py`, `store_kv.py`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stator.engines.native.kernels import pdl
from stator.engines.native.kernels.elementwise import rope_table, rotate_half
from stator.engines.native.kernels.pdl import pdl_sync


@triton.jit
def _summed(parts_ptr, bias_ptr, offs, cols, mask, split_stride, SPLITS: tl.constexpr,
            HAS_BIAS: tl.constexpr, DTYPE: tl.constexpr):  # fmt: skip
    """The partials at `offs` summed in float32 (+ the bias at `cols`), rounded to DTYPE:
    what `gemv`'s own sum kernel writes."""
    acc = tl.load(parts_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    for s in tl.static_range(1, SPLITS):
        acc += tl.load(parts_ptr + s * split_stride + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    return acc.to(DTYPE)


@triton.jit
def _qkv_rope_store_kernel(
    parts_ptr,
    bias_ptr,
    qkv_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    slot_ptr,
    k_cache_ptr,
    v_cache_ptr,
    split_stride,
    parts_row,
    table_stride,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    HEADS_PAD: tl.constexpr,
    SPLITS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    t = tl.program_id(0).to(tl.int64)
    dtype = qkv_ptr.dtype.element_ty
    width = (NUM_Q_HEADS + 2 * NUM_KV_HEADS) * 2 * HALF
    pos = tl.load(pos_ptr + t).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    d = tl.arange(0, HALF)
    cos1, sin1, cos2, sin2 = rope_table(cos_ptr, sin_ptr, pos, table_stride, HALF)
    heads = tl.arange(0, HEADS_PAD)
    kv_width = NUM_KV_HEADS * 2 * HALF
    for which in tl.static_range(3):  # q, k, v
        if which == 0:
            col0 = 0
            hmask = heads < NUM_Q_HEADS
        elif which == 1:
            col0 = NUM_Q_HEADS * 2 * HALF
            hmask = heads < NUM_KV_HEADS
        else:
            col0 = (NUM_Q_HEADS + NUM_KV_HEADS) * 2 * HALF
            hmask = heads < NUM_KV_HEADS
        lo = col0 + heads[:, None] * (2 * HALF) + d[None, :]
        mask = hmask[:, None]
        x1 = _summed(parts_ptr, bias_ptr, t * parts_row + lo, lo, mask, split_stride,
                     SPLITS, HAS_BIAS, dtype)  # fmt: skip
        x2 = _summed(parts_ptr, bias_ptr, t * parts_row + lo + HALF, lo + HALF, mask,
                     split_stride, SPLITS, HAS_BIAS, dtype)  # fmt: skip
        if which < 2:  # RoPE on q and k
            y1, y2 = rotate_half(x1.to(tl.float32), x2.to(tl.float32), cos1, sin1, cos2, sin2)
            x1 = y1.to(dtype)
            x2 = y2.to(dtype)
        tl.store(qkv_ptr + t * width + lo, x1, mask=mask)
        tl.store(qkv_ptr + t * width + lo + HALF, x2, mask=mask)
        # The cache rows of k and v; slot -1 (a padded row) stores nothing.
        at = slot * kv_width + heads[:, None] * (2 * HALF) + d[None, :]
        if which == 1:
            tl.store(k_cache_ptr + at, x1, mask=mask & (slot >= 0))
            tl.store(k_cache_ptr + at + HALF, x2, mask=mask & (slot >= 0))
        elif which == 2:
            tl.store(v_cache_ptr + at, x1, mask=mask & (slot >= 0))
            tl.store(v_cache_ptr + at + HALF, x2, mask=mask & (slot >= 0))


def qkv_rope_store(
    parts: torch.Tensor,
    splits: int,
    bias: torch.Tensor | None,
    num_q_heads: int,
    num_kv_heads: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """q/k/v [T, (Hq + 2 Hkv) * D] from the projection's `parts`, q and k rotated, k and v
    also written to the caches [blocks, page, Hkv, D] at `slot_mapping` (-1: skipped).
    One split: rotates `parts` [T, width] in place and returns it."""
    tokens, width = parts.shape[-2:]
    dim = width // (num_q_heads + 2 * num_kv_heads)
    if parts.stride(-1) != 1 or parts.stride(-2) != width:
        raise ValueError("qkv_rope_store needs contiguous rows")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("qkv_rope_store needs contiguous caches")
    out = parts if splits == 1 else torch.empty((tokens, width), dtype=dtype, device=parts.device)
    if tokens == 0:
        return out
    _qkv_rope_store_kernel[(tokens,)](
        parts,
        bias if bias is not None else parts,
        out,
        cos,
        sin,
        positions,
        slot_mapping,
        k_cache,
        v_cache,
        tokens * width,
        width,
        cos.stride(0),
        NUM_Q_HEADS=num_q_heads,
        NUM_KV_HEADS=num_kv_heads,
        HALF=dim // 2,
        HEADS_PAD=triton.next_power_of_2(max(num_q_heads, num_kv_heads)),
        SPLITS=splits,
        HAS_BIAS=bias is not None,
        PDL=pdl.enabled(parts),
        launch_pdl=pdl.enabled(parts),
        num_warps=4,
    )
    return out


@triton.jit
def _add_rms_norm_kernel(
    parts_ptr,
    bias_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    split_stride,
    eps,
    N: tl.constexpr,
    BLOCK: tl.constexpr,
    SPLITS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PDL: tl.constexpr,
):
    pdl_sync(PDL)
    row = tl.program_id(0).to(tl.int64)
    dtype = out_ptr.dtype.element_ty
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = _summed(parts_ptr, bias_ptr, row * N + offs, offs, mask, split_stride, SPLITS,
                HAS_BIAS, dtype)  # fmt: skip
    x = (x.to(tl.float32) + tl.load(residual_ptr + row * N + offs, mask=mask, other=0.0)).to(dtype)
    tl.store(residual_ptr + row * N + offs, x, mask=mask)
    h = x.to(tl.float32)
    h = h * tl.rsqrt(tl.sum(h * h, 0) / N + eps)
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0)
    y = h.to(dtype).to(tl.float32) * w.to(tl.float32)
    tl.store(out_ptr + row * N + offs, y.to(dtype), mask=mask)


def add_rms_norm(
    parts: torch.Tensor,
    splits: int,
    bias: torch.Tensor | None,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """residual += the projection's output (in place, rounded to its dtype), then the
    RMSNorm of that sum: `elementwise.rms_norm(x, weight, eps, residual)` with x summed
    from `parts` in the same kernel."""
    rows, n = residual.shape
    out = torch.empty_like(residual)
    if rows == 0:
        return out
    if parts.stride(-1) != 1 or parts.stride(-2) != n or not residual.is_contiguous():
        raise ValueError("add_rms_norm needs contiguous rows")
    _add_rms_norm_kernel[(rows,)](
        parts,
        bias if bias is not None else parts,
        residual,
        weight,
        out,
        rows * n,
        eps,
        N=n,
        BLOCK=triton.next_power_of_2(n),
        SPLITS=splits,
        HAS_BIAS=bias is not None,
        PDL=pdl.enabled(parts),
        launch_pdl=pdl.enabled(parts),
        num_warps=8 if n >= 4096 else 4,
    )
    return out


@triton.jit
def _silu_mul_kernel(parts_ptr, out_ptr, split_stride, N: tl.constexpr, BLOCK: tl.constexpr,
                     SPLITS: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    pdl_sync(PDL)
    row = tl.program_id(0).to(tl.int64)
    dtype = out_ptr.dtype.element_ty
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    base = row * 2 * N + offs
    gate = _summed(parts_ptr, parts_ptr, base, offs, mask, split_stride, SPLITS, False, dtype)
    up = _summed(parts_ptr, parts_ptr, base + N, offs, mask, split_stride, SPLITS, False, dtype)
    gate = gate.to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(up.dtype)
    tl.store(out_ptr + row * N + offs, act * up, mask=mask)


def silu_mul(parts: torch.Tensor, splits: int, dtype: torch.dtype) -> torch.Tensor:
    """silu(gate) * up for the fused gate/up projection's output [M, 2N] (no bias), from
    `parts`: `elementwise.silu_mul` with the sum in the same kernel."""
    rows, two_n = parts.shape[-2:]
    n = two_n // 2
    out = torch.empty((rows, n), dtype=dtype, device=parts.device)
    if rows == 0:
        return out
    if parts.stride(-1) != 1 or parts.stride(-2) != two_n:
        raise ValueError("silu_mul needs contiguous rows")
    block = 1024
    _silu_mul_kernel[(rows, triton.cdiv(n, block))](
        parts, out, rows * two_n, N=n, BLOCK=block, SPLITS=splits, PDL=pdl.enabled(parts),
        launch_pdl=pdl.enabled(parts),
    )  # fmt: skip
    return out
