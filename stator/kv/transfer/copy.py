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
MIN_AVERAGE_RUN = 4
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
    # One copy per run when runs are few or long (a run of 4 blocks is 8 MiB on an 8B
    # model: the copy engine's per-copy cost is small against it).
    if len(runs) <= MAX_RUN_COPIES or len(remote) >= MIN_AVERAGE_RUN * len(runs):
        for r, lo, n in runs:
            dst_pool[:, :, lo : lo + n].copy_(src_pool[:, :, r : r + n], non_blocking=True)
    elif src_pool.device != dst_pool.device and src_pool.is_cuda:
        _pipelined(src_pool, dst_pool, remote, local)
    else:
        per_chunk = max(1, CHUNK_BYTES // block_bytes(src_pool))
        for start in range(0, len(remote), per_chunk):
            ids = remote[start : start + per_chunk]
            scatter(dst_pool, local[start : start + per_chunk], gather(src_pool, ids))
    return len(remote) * block_bytes(src_pool)


_side_streams: dict[torch.device, list[torch.cuda.Stream]] = {}


def _pipelined(src: torch.Tensor, dst: torch.Tensor, remote: list[int], local: list[int]) -> None:
    """Scattered blocks between two GPUs: per chunk, gather on the source GPU, one
    contiguous copy across the link, scatter on this GPU. Gathers alternate between two
    streams of the source GPU, so chunk i+1 is gathered while chunk i crosses. Enqueued on
    the destination's current stream (the copy of chunk i waits for it, and it waits for
    the copy), like `copy_blocks`' other paths."""
    streams = _side_streams.get(src.device)
    if streams is None:
        streams = _side_streams[src.device] = [torch.cuda.Stream(src.device) for _ in range(2)]
    dst_stream = torch.cuda.current_stream(dst.device)
    per_chunk = max(1, (CHUNK_BYTES // 4) // block_bytes(src))
    for i, start in enumerate(range(0, len(remote), per_chunk)):
        side = streams[i % 2]
        side.wait_stream(torch.cuda.current_stream(src.device))
        with torch.cuda.stream(side):
            staged = gather(src, remote[start : start + per_chunk])
            # A cross-device copy runs on the source's current stream (`side` here) after
            # the destination's current stream, which then waits for it.
            moved = staged.to(dst.device, non_blocking=True)
        staged.record_stream(side)
        scatter(dst, local[start : start + per_chunk], moved)
        moved.record_stream(dst_stream)
