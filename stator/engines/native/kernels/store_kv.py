"""Write this step's keys and values into the paged cache: one program per token, one
contiguous row of Hkv * D elements each for K and V. Slot -1 skips the token (the padded
rows of a CUDA-graph batch)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    k_stride,
    v_stride,
    WIDTH: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    offs = tl.arange(0, BLOCK)
    mask = offs < WIDTH
    k = tl.load(k_ptr + t.to(tl.int64) * k_stride + offs, mask=mask)
    v = tl.load(v_ptr + t.to(tl.int64) * v_stride + offs, mask=mask)
    tl.store(k_cache_ptr + slot * WIDTH + offs, k, mask=mask)
    tl.store(v_cache_ptr + slot * WIDTH + offs, v, mask=mask)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """k, v [T, Hkv, D] (rows may be strided, each row contiguous); caches
    [num_blocks, block_size, Hkv, D] contiguous; slot_mapping [T] (-1 = skip)."""
    tokens, heads, dim = k.shape
    width = heads * dim
    for x in (k, v):
        if x.stride(2) != 1 or x.stride(1) != dim:
            raise ValueError("store_kv needs each token's [Hkv, D] row contiguous")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("store_kv needs contiguous caches")
    if tokens == 0:
        return
    _store_kv_kernel[(tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        v.stride(0),
        WIDTH=width,
        BLOCK=triton.next_power_of_2(width),
        num_warps=4,
    )
