"""Fused element-wise kernels for the decoder layers. At small batches a layer's cost is
as much the number of kernels as the bytes: unfused, RMSNorm is ~7 launches, RoPE ~12 and
SiLU-and-mul 3; each of these is one here.

Numerics follow the PyTorch code they replace: the residual sum is rounded to the model's
dtype before it is normalized; the normalized value is rounded before the weight multiply.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    residual_ptr,
    weight_ptr,
    out_ptr,
    x_stride,
    eps,
    N: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * x_stride + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        x = (x.to(tl.float32) + tl.load(residual_ptr + row * N + offs, mask=mask, other=0.0)).to(
            x_ptr.dtype.element_ty
        )
        tl.store(residual_ptr + row * N + offs, x, mask=mask)
    h = x.to(tl.float32)
    h = h * tl.rsqrt(tl.sum(h * h, 0) / N + eps)
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0)
    y = h.to(x_ptr.dtype.element_ty).to(tl.float32) * w.to(tl.float32)
    tl.store(out_ptr + row * N + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor:
    """RMSNorm of x [T, N]; with `residual`, first residual += x (in place, rounded to the
    dtype) and normalize that sum instead."""
    rows, n = x.shape
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    if x.stride(1) != 1 or (residual is not None and not residual.is_contiguous()):
        raise ValueError("rms_norm needs contiguous rows")
    _rms_norm_kernel[(rows,)](
        x,
        residual if residual is not None else x,
        weight,
        out,
        x.stride(0),
        eps,
        N=n,
        BLOCK=triton.next_power_of_2(n),
        HAS_RESIDUAL=residual is not None,
        num_warps=8 if n >= 4096 else 4,
    )
    return out


@triton.jit
def rope_table(cos_ptr, sin_ptr, pos, table_stride, HALF: tl.constexpr):
    """cos and sin at position `pos` for a head's two halves (float32 tables [P, 2 * HALF]):
    (cos1, sin1, cos2, sin2), each [HALF]."""
    d = tl.arange(0, HALF)
    row = pos * table_stride
    cos1 = tl.load(cos_ptr + row + d)
    sin1 = tl.load(sin_ptr + row + d)
    cos2 = tl.load(cos_ptr + row + HALF + d)
    sin2 = tl.load(sin_ptr + row + HALF + d)
    return cos1, sin1, cos2, sin2


@triton.jit
def rotate_half(x1, x2, cos1, sin1, cos2, sin2):
    """Rotate half, float32 [H, HALF] halves: [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin]."""
    y1 = x1 * cos1[None, :] - x2 * sin1[None, :]
    y2 = x2 * cos2[None, :] + x1 * sin2[None, :]
    return y1, y2


@triton.jit
def _rope_kernel(
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    q_stride,
    k_stride,
    table_stride,
    NUM_Q_HEADS: tl.constexpr,
    NUM_K_HEADS: tl.constexpr,
    HALF: tl.constexpr,
    HEADS_PAD: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    d = tl.arange(0, HALF)
    cos1, sin1, cos2, sin2 = rope_table(cos_ptr, sin_ptr, pos, table_stride, HALF)
    heads = tl.arange(0, HEADS_PAD)
    for which in tl.static_range(2):
        if which == 0:
            base = q_ptr + t * q_stride
            hmask = heads < NUM_Q_HEADS
        else:
            base = k_ptr + t * k_stride
            hmask = heads < NUM_K_HEADS
        lo_ptr = base + heads[:, None] * (2 * HALF) + d[None, :]
        x1 = tl.load(lo_ptr, mask=hmask[:, None], other=0.0).to(tl.float32)
        x2 = tl.load(lo_ptr + HALF, mask=hmask[:, None], other=0.0).to(tl.float32)
        y1, y2 = rotate_half(x1, x2, cos1, sin1, cos2, sin2)
        tl.store(lo_ptr, y1.to(q_ptr.dtype.element_ty), mask=hmask[:, None])
        tl.store(lo_ptr + HALF, y2.to(q_ptr.dtype.element_ty), mask=hmask[:, None])


def rope_(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
) -> None:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] in place (rows may be strided, heads
    contiguous); cos/sin [max_positions, D] float32 tables."""
    tokens, hq, dim = q.shape
    hk = k.shape[1]
    for x in (q, k):
        if x.stride(2) != 1 or x.stride(1) != dim:
            raise ValueError("rope_ needs each token's heads contiguous")
    if tokens == 0:
        return
    _rope_kernel[(tokens,)](
        q,
        k,
        cos,
        sin,
        positions,
        q.stride(0),
        k.stride(0),
        cos.stride(0),
        NUM_Q_HEADS=hq,
        NUM_K_HEADS=hk,
        HALF=dim // 2,
        HEADS_PAD=triton.next_power_of_2(max(hq, hk)),
        num_warps=4,
    )


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, x_stride, N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    gate = tl.load(x_ptr + row * x_stride + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + N + offs, mask=mask, other=0.0)
    act = (gate / (1.0 + tl.exp(-gate))).to(up.dtype)
    tl.store(out_ptr + row * N + offs, act * up, mask=mask)


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[:, :N]) * x[:, N:] for x [T, 2N]."""
    rows, two_n = x.shape
    n = two_n // 2
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    block = 1024
    _silu_mul_kernel[(rows, triton.cdiv(n, block))](x, out, x.stride(0), N=n, BLOCK=block)
    return out
