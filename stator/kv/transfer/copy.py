"""Moving blocks between two pools that one process can address (the same process, or a
peer GPU's pool opened through CUDA IPC): few, large copies, never one per block.

The ways to copy (`METHODS`), all enqueued on the destination's current stream:

- `push`: one Triton kernel on the source GPU reads the blocks locally and writes them
  into the peer's pool (`kernel.py`); whatever the ids, one launch, no staging;
- `pull`: the same kernel on the destination GPU, reading across the link (the source
  pool must be mapped in this GPU's context: `ipc.open_pool(..., here=True)`);
- `runs`: torch only: each run of ids consecutive on both sides is one strided copy, and
  scattered ids are gathered and scattered by torch's indexing (the CPU's way, and the
  GPU's when Triton is missing or the kernel failed).

Measured on 2×H200 (link: 396 GB/s for one `copy_`; benchmarks/README.md), 8B-shaped
2 MiB blocks, one process, scattered ids of a 1k / 8k / 32k-token prompt: `runs` 140 /
183 / 193 GB/s (two torch indexing passes around the crossing), `push` 271 / 348 / 353,
`pull` 255 / 348 / 363; consecutive ids: `runs` 315 / 345 / 349, the kernels within 2% at
8k and 32k but 13-23% behind at 1k. Pipelining a gather / copy-engine copy / scatter over staging buffers
reached only 122-266 GB/s (host-bound launches), so it is not kept.
"""

from __future__ import annotations

import logging

import torch

from stator.kv.block_copy import block_bytes, gather, scatter
from stator.kv.transfer.config import COPIES

log = logging.getLogger(__name__)

METHODS = COPIES
# pull, not push: as fast in the engine (0.21 / 0.65 / 0.81 of the link against 0.22 /
# 0.63 / 0.82), and the decode worker's copy runs on its own GPU instead of taking turns
# with the prefill worker's kernels on the prefill GPU (contexts of two processes share a
# GPU by time slices). The agent maps the prefill pool in this GPU's context for it.
AUTO_GPU_METHOD = "pull"
# `runs`: above this many separate runs, gather/scatter beats run copies.
MAX_RUN_COPIES = 8
MIN_AVERAGE_RUN = 4
# Bytes staged at once by `runs`' gather/scatter (bounds the staging memory).
CHUNK_BYTES = 256 << 20

_kernel_failed: str | None = None  # why the Triton kernel is off in this process


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
    src_pool: torch.Tensor,
    dst_pool: torch.Tensor,
    remote: list[int],
    local: list[int],
    method: str = "auto",
) -> int:
    """Copy blocks `remote[i]` of `src_pool` into blocks `local[i]` of `dst_pool`;
    returns the bytes moved. Enqueued on the destination's current stream (callers
    synchronize it)."""
    global _kernel_failed
    if method not in METHODS:
        raise ValueError(f"unknown copy method {method!r}; choose from {METHODS}")
    if len(remote) != len(local):
        raise ValueError(f"{len(remote)} remote blocks for {len(local)} local ones")
    if src_pool.shape[:2] != dst_pool.shape[:2] or src_pool.shape[3:] != dst_pool.shape[3:]:
        raise ValueError(f"pool layouts differ: {tuple(src_pool.shape)} vs {tuple(dst_pool.shape)}")
    if not remote:
        return 0
    if method == "auto" or not (src_pool.is_cuda and dst_pool.is_cuda) or _kernel_failed:
        method = _auto(src_pool, dst_pool)
    if method == "runs":
        _copy_runs(src_pool, dst_pool, remote, local)
        return len(remote) * block_bytes(src_pool)
    from stator.kv.transfer import kernel

    if not kernel.supported(src_pool, dst_pool):
        raise ValueError(f"copy method {method!r} needs contiguous pools of one dtype")
    try:
        on = src_pool.device if method == "push" else dst_pool.device
        kernel.copy_blocks_kernel(src_pool, dst_pool, remote, local, on=on)
    except Exception as exc:
        # The kernel is an optimization: a driver or Triton that cannot run it (peer
        # access refused, a pointer check) must not cost the transfer.
        _kernel_failed = f"{type(exc).__name__}: {exc}"
        log.warning("KV copy kernel failed (%s); using torch copies from now on", exc)
        _copy_runs(src_pool, dst_pool, remote, local)
    return len(remote) * block_bytes(src_pool)


def _auto(src: torch.Tensor, dst: torch.Tensor) -> str:
    if not (src.is_cuda and dst.is_cuda) or _kernel_failed is not None:
        return "runs"
    try:
        from stator.kv.transfer import kernel
    except ImportError:  # no Triton
        return "runs"
    return AUTO_GPU_METHOD if kernel.supported(src, dst) else "runs"


def _copy_runs(src: torch.Tensor, dst: torch.Tensor, remote: list[int], local: list[int]):
    runs = paired_runs(remote, local)
    # One copy per run when runs are few or long (a run of 4 blocks is 8 MiB on an 8B
    # model: the per-copy cost is small against it).
    if len(runs) <= MAX_RUN_COPIES or len(remote) >= MIN_AVERAGE_RUN * len(runs):
        for r, lo, n in runs:
            dst[:, :, lo : lo + n].copy_(src[:, :, r : r + n], non_blocking=True)
        return
    per_chunk = max(1, CHUNK_BYTES // block_bytes(src))
    for start in range(0, len(remote), per_chunk):
        ids = remote[start : start + per_chunk]
        scatter(dst, local[start : start + per_chunk], gather(src, ids))
