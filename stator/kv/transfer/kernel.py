"""One Triton kernel that copies any set of KV blocks from one pool to another, on one GPU
or across two (peer access over NVLink), with no staging buffer.

Pools are `stator.kv.block_copy`'s `[layers, 2, blocks, block_size, heads, dim]`: block b
is 2 * layers slices (32 KiB each for an 8B model). Program (i, s, c) copies chunk c of
slice s of block pair i (as int32, in 16-byte accesses), so one launch moves every block
whatever the ids: no per-block copies (1.3 GB/s in issue 15's measurement), no gather /
copy / scatter passes over HBM. Run on the source GPU it *pushes* (local reads, peer
writes); on the destination GPU it *pulls* (peer reads; a pool opened through CUDA IPC
must then be mapped in the destination GPU's context, or Triton refuses its pointer).
Streams are ordered as `Tensor.copy_` orders a cross-device copy: the kernel waits for the
destination's current stream, and that stream waits for the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

# int32 elements one program copies at most: 16 KiB, half an 8B block slice (256 threads
# of 4 16-byte accesses each).
MAX_PROGRAM_ELEMENTS = 4096


@triton.jit
def _copy_pair(
    src_ptr,
    dst_ptr,
    src_ids_ptr,
    dst_ids_ptr,
    pair,
    src_piece_stride,
    src_block_stride,
    dst_piece_stride,
    dst_block_stride,
    SLICE: tl.constexpr,
    BLOCK: tl.constexpr,
    EVEN: tl.constexpr,
):
    piece = tl.program_id(1)  # (layer, k/v) slice
    chunk = tl.program_id(2)
    src_block = tl.load(src_ids_ptr + pair).to(tl.int64)
    dst_block = tl.load(dst_ids_ptr + pair).to(tl.int64)
    offs = chunk * BLOCK + tl.arange(0, BLOCK)
    piece = piece.to(tl.int64)
    src = src_ptr + piece * src_piece_stride + src_block * src_block_stride + offs
    dst = dst_ptr + piece * dst_piece_stride + dst_block * dst_block_stride + offs
    if EVEN:
        tl.store(dst, tl.load(src))
    else:
        mask = offs < SLICE
        tl.store(dst, tl.load(src, mask=mask), mask=mask)


@triton.jit
def _copy_blocks_kernel(
    src_ptr,
    dst_ptr,
    src_ids_ptr,
    dst_ids_ptr,
    count_ptr,  # COUNTED: the number of pairs, read on the device (grid may be larger)
    src_piece_stride,
    src_block_stride,
    dst_piece_stride,
    dst_block_stride,
    SLICE: tl.constexpr,  # int32 elements in one block's slice
    BLOCK: tl.constexpr,  # int32 elements per program
    EVEN: tl.constexpr,  # BLOCK divides SLICE: no mask (keeps the 16-byte accesses)
    COUNTED: tl.constexpr,  # programs past *count_ptr pairs do nothing
):
    pair = tl.program_id(0)
    args = (src_piece_stride, src_block_stride, dst_piece_stride, dst_block_stride)
    if COUNTED:
        if pair < tl.load(count_ptr):
            _copy_pair(src_ptr, dst_ptr, src_ids_ptr, dst_ids_ptr, pair, *args, SLICE, BLOCK, EVEN)
    else:
        _copy_pair(src_ptr, dst_ptr, src_ids_ptr, dst_ids_ptr, pair, *args, SLICE, BLOCK, EVEN)


def supported(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """Whether the kernel can copy between these pools (CUDA, or Triton's interpreter)."""
    slice_bytes = src[0, 0, 0].numel() * src.element_size()
    return (
        src.is_contiguous()
        and dst.is_contiguous()
        and src.dtype == dst.dtype
        and slice_bytes % 16 == 0
        and src.shape[:2] == dst.shape[:2]
        and src.shape[3:] == dst.shape[3:]
    )


def launch_meta(slice_words: int) -> dict:
    block = min(MAX_PROGRAM_ELEMENTS, triton.next_power_of_2(slice_words))
    return {"SLICE": slice_words, "BLOCK": block, "EVEN": slice_words % block == 0}


def chunks_per_slice(slice_words: int) -> int:
    return triton.cdiv(slice_words, launch_meta(slice_words)["BLOCK"])


def _launch(
    src: torch.Tensor,
    dst: torch.Tensor,
    pairs: int,
    src_ids: torch.Tensor,
    dst_ids: torch.Tensor,
    count: torch.Tensor,
    counted: bool,
) -> tuple[tuple[int, int, int], tuple, dict]:
    """The grid, arguments and meta-parameters of one `_copy_blocks_kernel` launch over
    `pairs` block pairs: the pools as int32 words, one program row per pair, one per
    (layer, k/v) slice, one per chunk of a slice (`count` is read only when `counted`).
    Shared by both launches so that they can never disagree on the geometry."""
    words_src, words_dst = src.view(torch.int32), dst.view(torch.int32)
    slice_words = words_src[0, 0, 0].numel()
    grid = (pairs, src.shape[0] * 2, chunks_per_slice(slice_words))
    # (layer, k/v) slices are `stride(1)` apart, a slice's blocks `stride(2)`.
    args = (
        words_src,
        words_dst,
        src_ids,
        dst_ids,
        count,
        *words_src.stride()[1:3],
        *words_dst.stride()[1:3],
    )
    meta = launch_meta(slice_words) | {"COUNTED": counted}
    if src_ids.is_cuda:  # not in Triton's interpreter (tests on the CPU)
        meta["num_warps"] = 8
    return grid, args, meta


_peer_enabled: set[tuple[int, int]] = set()


def enable_peer_access(a: torch.device, b: torch.device) -> None:
    """Let kernels on either GPU address the other's memory. torch turns peer access on
    (in its own cache of it) the first time it copies between two devices, so one tiny
    copy each way does it without calling the CUDA runtime ourselves."""
    if a == b or (a.index, b.index) in _peer_enabled:
        return
    x = torch.zeros(1, device=a)
    y = torch.zeros(1, device=b)
    y.copy_(x)
    x.copy_(y)
    torch.cuda.synchronize(a)
    torch.cuda.synchronize(b)
    _peer_enabled.update({(a.index, b.index), (b.index, a.index)})


def copy_blocks_kernel(
    src: torch.Tensor,
    dst: torch.Tensor,
    remote: Sequence[int],
    local: Sequence[int],
    on: torch.device | None = None,
) -> None:
    """Copy blocks `remote[i]` of `src` into blocks `local[i]` of `dst` with one launch on
    device `on` (default: the source's, i.e. push). Enqueued in stream order on the
    destination's current stream (see the module docstring)."""
    run = on if on is not None else src.device
    ids = torch.tensor([list(remote), list(local)], dtype=torch.int32)
    if run.type == "cuda":
        enable_peer_access(run, dst.device if run == src.device else src.device)
        ids = ids.pin_memory().to(run, non_blocking=True)  # on run's current stream
    grid, args, meta = _launch(src, dst, len(remote), ids[0], ids[1], ids[0], counted=False)
    if run.type != "cuda":  # Triton's interpreter (tests on the CPU)
        _copy_blocks_kernel[grid](*args, **meta)
        return
    dst_stream = torch.cuda.current_stream(dst.device)
    run_stream = torch.cuda.current_stream(run)
    if run != dst.device:
        run_stream.wait_stream(dst_stream)
    with torch.cuda.device(run):
        _copy_blocks_kernel[grid](*args, **meta)
    ids.record_stream(run_stream)
    if run != dst.device:
        dst_stream.wait_stream(run_stream)


def copy_counted(src: torch.Tensor, dst: torch.Tensor, ids: torch.Tensor, pairs: int) -> None:
    """One launch of `pairs` programs' rows that copies the first `ids[0]` pairs of
    `ids` = [count, remote ids (cap of them), local ids (cap)], read on the device: the
    same launch serves any count up to `pairs`, so it can be captured once in a CUDA graph
    and replayed for every pull of up to that many blocks (`peer_copier.py`). On CUDA it
    runs on the current device and stream (the caller orders it); on the CPU, in Triton's
    interpreter."""
    cap = (ids.numel() - 1) // 2
    grid, args, meta = _launch(src, dst, pairs, ids[1 : 1 + cap], ids[1 + cap :], ids, counted=True)
    _copy_blocks_kernel[grid](*args, **meta)
