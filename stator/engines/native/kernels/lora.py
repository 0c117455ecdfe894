"""Batched LoRA matmuls for a step whose tokens use different adapters (Punica/S-LoRA
style): `shrink` h = x @ A_slot^T, then `expand` y += h @ B_slot^T, each token with its
own slot's weights, in one launch per projection whatever the mix of adapters.

Both are one kernel, `_segment_matmul`: out[rows] (+)= in[rows] @ W_slot^T for the rows
of one tile of `LoraBatch.tiles` (up to 16 tokens of one slot, gathered through
`sorted_idx`), so each slot's weights are read once per tile of its tokens, on the tensor
cores; the grid has one program per (tile, column block, K split) and no program looks at
a slot the step does not use. A decode step's LoRA costs launches more than bytes (8
rank-16 adapters add ~4% to an 8B model's weight reads, over 256 launches), so at decode
sizes the shrink splits K until a program reads one to three 128-wide slabs of A, adding
its partial sums atomically into a zeroed float32 h, and the expand takes wide column
blocks in one pass over the rank. Measured on an H100 (benchmarks/README.md): the 8B
shape's 257 launches take 0.70 ms a step at batch 1 and 1.21 ms at batch 64; the K-split
target (256 to 4,096 programs) moves that by under 8%.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stator.engines.native.lora.batch import TILE_M, LoraBatch


@triton.jit
def _segment_matmul(
    in_ptr,
    w_ptr,
    out_ptr,
    tiles_ptr,
    idx_ptr,
    N,
    K,
    k_iters,
    cut1,
    cut2,
    shard_cols,
    in_stride,
    w_stride_slot,
    w_stride_n,
    out_stride,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ATOMIC: tl.constexpr,
    IEEE: tl.constexpr,
):
    """out[rows, cols] (+)= in[rows, shard * shard_cols + k] @ W[slot, cols, k]^T over this
    program's K split. A column block lies in one shard (cut1, cut2: where shards 1 and 2
    begin; block sizes divide them). ATOMIC: add into float32 `out` (K is split over
    programs); else read-modify-write `out` in its own dtype (K whole)."""
    tile = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    count = tl.load(tiles_ptr + tile * 3 + 2)
    if count == 0:  # a padding tile of a CUDA graph's fixed grid
        return
    slot = tl.load(tiles_ptr + tile * 3)
    start = tl.load(tiles_ptr + tile * 3 + 1)
    offs_m = tl.arange(0, BLOCK_M)
    m_ok = offs_m < count
    rows = tl.load(idx_ptr + start + offs_m, mask=m_ok, other=0).to(tl.int64)
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    shard = (n0 >= cut1).to(tl.int32) + (n0 >= cut2).to(tl.int32)
    in_base = in_ptr + rows[:, None] * in_stride + shard * shard_cols
    w_base = w_ptr + slot.to(tl.int64) * w_stride_slot + offs_n[None, :].to(tl.int64) * w_stride_n
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k0 = split * k_iters * BLOCK_K
    k_end = k0 + k_iters * BLOCK_K
    # A while loop: Triton's interpreter (the CPU tests) cannot take a runtime trip count
    # in `range`, and a constexpr one would compile a kernel per split. Decode steps run
    # one to two iterations, so there is little for software pipelining to overlap.
    while k0 < k_end:
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x = tl.load(in_base + ks[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_base + ks[:, None], mask=n_ok[None, :] & k_ok[:, None], other=0.0)
        if IEEE:
            acc += tl.dot(x.to(tl.float32), w.to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(x.to(w.dtype), w)
        k0 += BLOCK_K
    mask = m_ok[:, None] & n_ok[None, :]
    out_ptrs = out_ptr + rows[:, None] * out_stride + offs_n[None, :]
    if ATOMIC:
        tl.atomic_add(out_ptrs, acc, mask=mask)
    else:
        y = tl.load(out_ptrs, mask=mask, other=0.0)
        tl.store(out_ptrs, (y.to(tl.float32) + acc).to(y.dtype), mask=mask)


# Programs a shrink launch aims for: enough K splits to keep ~all SMs reading A at decode
# sizes (an H100 has 132), few enough that large steps do not flood L2 with atomics.
_SHRINK_PROGRAMS = 1024
_SHRINK_BLOCK_K = 128
# An expand column block is the widest dividing the shard bounds that still leaves this
# many blocks (one pass over the rank each), so small outputs still spread over the SMs.
_EXPAND_MIN_BLOCKS = 64


def _launch(
    inp: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    batch: LoraBatch,
    *,
    k: int,
    block_n: int,
    block_k: int,
    split: int,
    cuts: tuple[int, int],
    shard_cols: int,
    atomic: bool,
) -> None:
    tiles = batch.tiles.shape[0]
    n = w.shape[1]
    chunks = triton.cdiv(k, block_k)
    k_iters = triton.cdiv(chunks, split)
    split = triton.cdiv(chunks, k_iters)
    grid = (tiles, triton.cdiv(n, block_n), split)
    _segment_matmul[grid](
        inp,
        w,
        out,
        batch.tiles,
        batch.sorted_idx,
        n,
        k,
        k_iters,
        cuts[0],
        cuts[1],
        shard_cols,
        inp.stride(0),
        w.stride(0),
        w.stride(1),
        out.stride(0),
        BLOCK_M=TILE_M,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        ATOMIC=atomic,
        IEEE=w.dtype == torch.float32,
    )


def lora_shrink(x: torch.Tensor, a: torch.Tensor, batch: LoraBatch, index: int = 0) -> torch.Tensor:
    """h [T, n * R] float32 = x @ A_slot^T for every token that uses an adapter (rows of
    base-model tokens are left zero). `index`: the projection's row of the batch's zeroed
    workspace (`LoraBatch.scratch`)."""
    if x.stride(1) != 1:
        x = x.contiguous()
    _, k = x.shape
    _, n, _ = a.shape
    h = batch.scratch(index, n, x.device)
    block_n = min(64, max(16, triton.next_power_of_2(n)))
    block_k = min(_SHRINK_BLOCK_K, max(16, triton.next_power_of_2(k)))
    programs = batch.tiles.shape[0] * triton.cdiv(n, block_n)
    split = max(1, _SHRINK_PROGRAMS // max(1, programs))
    big = n + 1  # one shard: no column block reaches a second
    _launch(
        x,
        a,
        h,
        batch,
        k=k,
        block_n=block_n,
        block_k=block_k,
        split=split,
        cuts=(big, big),
        shard_cols=0,
        atomic=True,
    )
    return h


def _expand_block(bounds: list[tuple[int, int]], n: int) -> int:
    cuts = [start for start, _ in bounds[1:]]
    dividing = [b for b in (128, 64, 32, 16) if all(c % b == 0 for c in cuts)]
    if not dividing:
        raise ValueError(f"LoRA shard bounds {bounds} are not multiples of 16")
    wide = [b for b in dividing if triton.cdiv(n, b) >= _EXPAND_MIN_BLOCKS]
    return wide[0] if wide else dividing[-1]


def lora_expand(
    h: torch.Tensor,
    b: torch.Tensor,
    y: torch.Tensor,
    batch: LoraBatch,
    bounds: list[tuple[int, int]],
    rank: int,
) -> None:
    """y[token, shard cols] += h[token, shard's R cols] @ B_slot[shard rows]^T, in place."""
    n = b.shape[1]
    cuts = [start for start, _ in bounds[1:]] + [n + 1, n + 1]
    _launch(
        h,
        b,
        y,
        batch,
        k=rank,
        block_n=_expand_block(bounds, n),
        block_k=max(16, triton.next_power_of_2(min(rank, 64))),
        split=1,
        cuts=(cuts[0], cuts[1]),
        shard_cols=rank,
        atomic=False,
    )
