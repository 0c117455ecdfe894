"""Moving blocks between two pools that one process can address (the same process, or a
peer GPU's pool opened through CUDA IPC): few, large copies.

Measured on 2×H200 (issue 15): one `copy_` between GPUs moves ~389 GB/s, one copy per
32 KiB block slice ~1.3 GB/s. So blocks never move one by one:

- where both the remote and the local block ids run consecutively, each pair of runs is
  one strided copy of `2 * layers` slices straight from pool to pool (no staging; on a
  peer-mapped pool the copy kernel reads across the link once);
- otherwise the remote blocks are gathered in chunks (one indexing kernel each, reading
  across the link), and each chunk is scattered into the local blocks with one kernel.
"""

from __future__ import annotations

import torch

from stator.kv.block_copy import block_bytes, gather, scatter

# Above this many separate runs, gather/scatter (2 kernels a chunk) beats run copies.
MAX_RUN_COPIES = 8
# Bytes staged at once when gathering (bounds the staging memory).
CHUNK_BYTES = 256 << 20


def paired_runs(remote: list[int], local: list[int]) -> list[tuple[int, int, int]]:
    """Maximal (remote start, local start, length) runs where both sides are consecutive."""
    out: list[tuple[int, int, int]] = []
    i = 0
    while i < len(remote):
        j = i + 1
        while j < len(remote) and remote[j] == remote[j - 1] + 1 and local[j] == local[j - 1] + 1:
            j += 1
        out.append((remote[i], local[i], j - i))
        i = j
    return out


def copy_blocks(
    src_pool: torch.Tensor, dst_pool: torch.Tensor, remote: list[int], local: list[int]
) -> int:
    """Copy blocks `remote[i]` of `src_pool` into blocks `local[i]` of `dst_pool`;
    returns the bytes moved. Enqueued on the current stream (callers synchronize)."""
    if len(remote) != len(local):
        raise ValueError(f"{len(remote)} remote blocks for {len(local)} local ones")
    if not remote:
        return 0
    if src_pool.shape[:2] != dst_pool.shape[:2] or src_pool.shape[3:] != dst_pool.shape[3:]:
        raise ValueError(f"pool layouts differ: {tuple(src_pool.shape)} vs {tuple(dst_pool.shape)}")
    runs = paired_runs(remote, local)
    if len(runs) <= MAX_RUN_COPIES:
        for r, lo, n in runs:
            dst_pool[:, :, lo : lo + n].copy_(src_pool[:, :, r : r + n], non_blocking=True)
    else:
        per_chunk = max(1, CHUNK_BYTES // block_bytes(src_pool))
        for start in range(0, len(remote), per_chunk):
            ids = remote[start : start + per_chunk]
            scatter(dst_pool, local[start : start + per_chunk], gather(src_pool, ids))
    return len(remote) * block_bytes(src_pool)
