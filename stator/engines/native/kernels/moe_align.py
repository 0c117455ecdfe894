"""The fused MoE's sort of (token, expert) pairs by expert, each expert's run padded to a
multiple of BLOCK_M: the row blocks the grouped GEMMs (`fused_moe.py`) run over.

`align` does it in one launch (one program): a pass counting each expert's pairs, then a
pass placing each pair at its expert's start plus its rank among that expert's earlier
pairs (a cumulative sum over a one-hot [pairs, experts] chunk), then each block's expert.
The same in PyTorch ops (`align_reference`, the definition the tests hold it to) took ~28
launches: sort, cumsums, scatters, searchsorted, each a few microseconds of GPU time even
inside a CUDA graph, times every layer of every step. Neither syncs with the host, and the
shapes depend only on the pair count, so both run inside CUDA graphs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# The one program's size: values of a one-hot chunk, warps. H100, 1,024 pairs over 32
# experts, the sort alone as a CUDA graph (benchmarks/gpt_oss_gpu.py --parts gemm,
# 2026-11-28, two calls), µs: 14.3 / 14.1 with 8,192 and 4 warps, 13.7 with 4,096 and 4,
# 17.2 with 16,384 and 4, 16.9 with 8,192 and 8, 24.9 / 23.9 with 32,768 and 8 / 16, 27.6 /
# 19.8 with 8,192 / 4,096 and 2: bigger programs do not help; in the engine 12-13 us a layer.
ONE_HOT = 8192
WARPS = 4


def num_blocks(pairs: int, local: int, block_m: int) -> int:
    """Row blocks enough for any routing of `pairs` pairs over `local` experts."""
    return triton.cdiv(pairs + local * (block_m - 1), block_m)


def align_reference(
    local_ids: torch.Tensor, local: int, block_m: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted pair ids [blocks * block_m], padded with num_pairs; expert of each block,
    `local` past the last) for pair expert ids `local_ids` [T * k] in [0, local] (local:
    another rank's expert, left out). Pairs of one expert keep their order."""
    pairs = local_ids.numel()
    dev = local_ids.device
    blocks = num_blocks(pairs, local, block_m)
    counts = torch.zeros(local + 1, dtype=torch.long, device=dev)
    counts.scatter_add_(0, local_ids, torch.ones_like(local_ids))
    padded = (counts[:local] + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    # [local + 1] each expert's first row; the last, the drop slot of other ranks' pairs.
    # (Built on the device: a host scalar written into a tensor breaks graph capture.)
    drop = ends.new_full((1,), blocks * block_m)
    starts = torch.cat([ends.new_zeros(1), ends[:-1], drop])
    first_of = torch.cumsum(counts, 0) - counts  # each expert's first place in `order`
    order = torch.sort(local_ids, stable=True).indices
    expert = local_ids[order]
    rank = torch.arange(pairs, device=dev) - first_of[expert]
    place = starts[expert] + rank * (expert < local)
    sorted_ids = torch.full((blocks * block_m + 1,), pairs, dtype=torch.long, device=dev)
    sorted_ids.scatter_(0, place, order)
    block_starts = torch.arange(blocks, device=dev) * block_m
    block_expert = torch.searchsorted(ends, block_starts, right=True)
    return sorted_ids[:-1], block_expert


@triton.jit(do_not_specialize=["num_pairs", "num_rows", "num_blocks", "first"])  # one compile
def _align_kernel(
    ids_ptr, sorted_ptr, block_expert_ptr, num_pairs, num_rows, num_blocks, first,
    LOCAL: tl.constexpr, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    es = tl.arange(0, E_PAD)
    offs = tl.arange(0, CHUNK)
    # Padding first: every row no pair takes reads num_pairs (the kernels skip it).
    for r0 in range(0, num_rows, CHUNK):
        r = r0 + offs
        tl.store(sorted_ptr + r, tl.full([CHUNK], 0, tl.int64) + num_pairs, mask=r < num_rows)
    counts = tl.zeros([E_PAD], tl.int32)
    for p0 in range(0, num_pairs, CHUNK):
        p = p0 + offs
        e = tl.load(ids_ptr + p, mask=p < num_pairs, other=LOCAL + first) - first
        counts += tl.sum((e[:, None] == es[None, :]).to(tl.int32), axis=0)
    counts = tl.where(es < LOCAL, counts, 0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    tl.debug_barrier()  # the padding's stores before the pairs' (the same rows)
    seen = tl.zeros([E_PAD], tl.int32)  # each expert's pairs placed so far
    for p0 in range(0, num_pairs, CHUNK):
        p = p0 + offs
        e = tl.load(ids_ptr + p, mask=p < num_pairs, other=LOCAL + first) - first
        onehot = ((e[:, None] == es[None, :]) & (es < LOCAL)[None, :]).to(tl.int32)
        before = tl.cumsum(onehot, axis=0) - onehot + (starts + seen)[None, :]
        place = tl.sum(before * onehot, axis=1)
        ours = (p < num_pairs) & (e >= 0) & (e < LOCAL)  # another rank's expert: not placed
        tl.store(sorted_ptr + place, p.to(tl.int64), mask=ours)
        seen += tl.sum(onehot, axis=0)
    # Block b's expert: how many experts' padded runs end at or before its first row.
    ends = tl.where(es < LOCAL, ends, 1 << 30)
    for b0 in range(0, num_blocks, CHUNK):
        b = b0 + offs
        expert = tl.sum((ends[None, :] <= (b * BLOCK_M)[:, None]).to(tl.int64), axis=1)
        tl.store(block_expert_ptr + b, expert, mask=b < num_blocks)


def align(
    ids: torch.Tensor, local: int, block_m: int, first: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """`align_reference` in one launch for expert ids `ids` [T * k] of the whole model, this
    rank's experts being [first, first + local) (others left out): the same tensors, equal
    element for element, as for `ids - first` with the others set to `local`. Taking the
    model's ids spares the launches that made the local ones (a subtraction, and a `where`
    under tensor parallelism) every layer."""
    pairs = ids.numel()
    blocks = num_blocks(pairs, local, block_m)
    sorted_ids = torch.empty(blocks * block_m, dtype=torch.long, device=ids.device)
    block_expert = torch.empty(blocks, dtype=torch.long, device=ids.device)
    # One-hot chunks of ~ONE_HOT values: [256, 32] at 32 experts, [64, 128] at 128. Other
    # ranks' experts (ids - first outside [0, local)) match no expert column, or a padding
    # column that is masked.
    e_pad = triton.next_power_of_2(local)
    chunk = max(16, min(1024, ONE_HOT // e_pad))
    _align_kernel[(1,)](
        ids, sorted_ids, block_expert, pairs, blocks * block_m, blocks, first,
        LOCAL=local, E_PAD=e_pad, BLOCK_M=block_m, CHUNK=chunk, num_warps=WARPS,
    )  # fmt: skip
    return sorted_ids, block_expert
