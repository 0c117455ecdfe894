"""Batched LoRA matmuls for a step whose tokens use different adapters (Punica/S-LoRA
style): `shrink` h = x @ A_slot^T, then `expand` y += h @ B_slot^T, each token with its
own slot's weights, in one launch per projection whatever the mix of adapters.

The grid has one axis over slots: a program takes up to BLOCK_M tokens of one slot (their
rows come from `sorted_idx`, grouped by slot), so each slot's weights are read once per
tile of its tokens and multiplied on the tensor cores. Programs of slots with fewer tokens
exit at once; the grid depends only on the step's token count, so a decode CUDA graph
replays it for any mix of adapters. The shrink splits K (`down_proj` has 14k inputs) and
adds its partial sums atomically into a zeroed float32 h.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stator.engines.native.lora.batch import LoraBatch


@triton.jit
def _shrink_kernel(
    x_ptr,
    a_ptr,
    h_ptr,
    idx_ptr,
    starts_ptr,
    N,
    K,
    x_stride,
    a_stride_slot,
    h_stride,
    K_PER_SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    IEEE: tl.constexpr,
):
    pid = tl.program_id(0)
    slot = tl.program_id(1)
    split = tl.program_id(2)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    start = tl.load(starts_ptr + slot)
    count = tl.load(starts_ptr + slot + 1) - start
    if pid_m * BLOCK_M >= count:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < count
    rows = tl.load(idx_ptr + start + offs_m, mask=m_ok, other=0).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    a_base = a_ptr + slot.to(tl.int64) * a_stride_slot
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k_start = split * K_PER_SPLIT
    for kk in range(0, K_PER_SPLIT, BLOCK_K):
        ks = k_start + kk + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(
            x_ptr + rows[:, None] * x_stride + ks[None, :],
            mask=m_ok[:, None] & k_ok[None, :],
            other=0.0,
        )
        a = tl.load(
            a_base + offs_n[None, :].to(tl.int64) * K + ks[:, None],
            mask=n_ok[None, :] & k_ok[:, None],
            other=0.0,
        )
        if IEEE:
            acc += tl.dot(x, a, input_precision="ieee")
        else:
            acc += tl.dot(x, a)
    tl.atomic_add(
        h_ptr + rows[:, None] * h_stride + offs_n[None, :],
        acc,
        mask=m_ok[:, None] & n_ok[None, :],
    )


@triton.jit
def _expand_kernel(
    h_ptr,
    b_ptr,
    y_ptr,
    idx_ptr,
    starts_ptr,
    N,
    bound1,
    bound2,
    h_stride,
    b_stride_slot,
    y_stride,
    R: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    IEEE: tl.constexpr,
):
    pid = tl.program_id(0)
    slot = tl.program_id(1)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    start = tl.load(starts_ptr + slot)
    count = tl.load(starts_ptr + slot + 1) - start
    if pid_m * BLOCK_M >= count:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < count
    rows = tl.load(idx_ptr + start + offs_m, mask=m_ok, other=0).to(tl.int64)
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    # The shard this column block belongs to (block sizes divide the shard bounds).
    shard = (n0 >= bound1).to(tl.int32) + (n0 >= bound2).to(tl.int32)
    h_col = shard * R
    b_base = b_ptr + slot.to(tl.int64) * b_stride_slot
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for r0 in range(0, R, BLOCK_R):
        rs = r0 + tl.arange(0, BLOCK_R)
        r_ok = rs < R
        h = tl.load(
            h_ptr + rows[:, None] * h_stride + (h_col + rs)[None, :],
            mask=m_ok[:, None] & r_ok[None, :],
            other=0.0,
        )
        b = tl.load(
            b_base + offs_n[None, :].to(tl.int64) * R + rs[:, None],
            mask=n_ok[None, :] & r_ok[:, None],
            other=0.0,
        )
        if IEEE:
            acc += tl.dot(h, b.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(h.to(b.dtype), b)
    mask = m_ok[:, None] & n_ok[None, :]
    y_ptrs = y_ptr + rows[:, None] * y_stride + offs_n[None, :]
    y = tl.load(y_ptrs, mask=mask, other=0.0)
    tl.store(y_ptrs, (y.to(tl.float32) + acc).to(y.dtype), mask=mask)


_BLOCK_M = 16


def _split_k(k: int, block_k: int) -> int:
    return max(1, min(8, k // (block_k * 16)))


def lora_shrink(x: torch.Tensor, a: torch.Tensor, batch: LoraBatch, index: int = 0) -> torch.Tensor:
    """h [T, n * R] float32 = x @ A_slot^T for every token that uses an adapter (rows of
    base-model tokens are left zero). `index`: the projection's row of the batch's zeroed
    workspace, when it has one."""
    if x.stride(1) != 1:
        x = x.contiguous()
    tokens, k = x.shape
    slots, n, _ = a.shape
    if batch.workspace is not None:
        h = batch.workspace[index, :tokens, :n]
    else:
        h = torch.zeros(tokens, n, dtype=torch.float32, device=x.device)
    block_n = 16 if n <= 16 else 32
    block_k = 64
    split = _split_k(k, block_k)
    per_split = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
    grid = (triton.cdiv(tokens, _BLOCK_M) * triton.cdiv(n, block_n), slots, split)
    _shrink_kernel[grid](
        x,
        a,
        h,
        batch.sorted_idx,
        batch.starts,
        n,
        k,
        x.stride(0),
        a.stride(0),
        h.stride(0),
        K_PER_SPLIT=per_split,
        BLOCK_M=_BLOCK_M,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        IEEE=x.dtype == torch.float32,
    )
    return h


def _expand_block(bounds: list[tuple[int, int]]) -> int:
    cuts = [start for start, _ in bounds[1:]]
    for block in (64, 32, 16):
        if all(c % block == 0 for c in cuts):
            return block
    raise ValueError(f"LoRA shard bounds {bounds} are not multiples of 16")


def lora_expand(
    h: torch.Tensor,
    b: torch.Tensor,
    y: torch.Tensor,
    batch: LoraBatch,
    bounds: list[tuple[int, int]],
    rank: int,
) -> None:
    """y[token, shard cols] += h[token, shard's R cols] @ B_slot[shard rows]^T, in place."""
    tokens = h.shape[0]
    slots, n, _ = b.shape
    cuts = [start for start, _ in bounds[1:]] + [n + 1, n + 1]
    block_n = _expand_block(bounds)
    block_r = max(16, triton.next_power_of_2(min(rank, 64)))
    grid = (triton.cdiv(tokens, _BLOCK_M) * triton.cdiv(n, block_n), slots)
    _expand_kernel[grid](
        h,
        b,
        y,
        batch.sorted_idx,
        batch.starts,
        n,
        cuts[0],
        cuts[1],
        h.stride(0),
        b.stride(0),
        y.stride(0),
        R=rank,
        BLOCK_M=_BLOCK_M,
        BLOCK_N=block_n,
        BLOCK_R=block_r,
        IEEE=y.dtype == torch.float32,
    )
