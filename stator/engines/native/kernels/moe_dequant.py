"""Large MXFP4 batches (prefill) through the bf16 grouped GEMMs: expand a chunk of experts
to the model dtype in a scratch buffer, run `fused_moe` on that chunk as if it were a
tensor-parallel rank holding only those experts (pairs of other experts are skipped), and
sum the chunks. The expansion reads 0.53 bytes and writes 2 per weight, whatever the
batch; the packed GEMMs' in-register dequantization grows with it.

On from 10,240 pairs (2,560 tokens of top-4). H100, 20B, one layer as a CUDA graph
against the packed GEMMs of the same size (`tl.dot_scaled` above 1,024 pairs;
benchmarks/gpt_oss_gpu.py, 2026-11-27): 512 tokens 2,009 us expanded vs 1,083 packed,
1,024 tokens 2,182 vs 1,498, 2,048 tokens 2,575 vs 2,350; expanded grows ~0.4 us a token,
packed ~0.85, so they meet near 2,560. (Against the earlier byte-wise packed GEMM the
expansion won from 1,024 tokens: a 2,048-token TTFT of 74.6 ms vs 294.4.) The scratch is
allocated in the engine's warm-up step (a full `max_num_batched_tokens` prefill), so the
KV cache is sized without it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# Pairs from which a packed layer expands its experts (0 = never) and experts per chunk
# (the scratch holds CHUNK * 3 * H * I values in the model dtype: 0.8 GB at 16 for GPT-OSS).
# Expanding costs about the same at any batch (20B: ~0.42 GB read and 1.6 GB written a
# layer), the packed GEMM's dequantization grows with it.
MIN_PAIRS = 10240
CHUNK = 16


@triton.jit
def _expand_kernel(blocks_ptr, scales_ptr, out_ptr, half_k, BLOCK: tl.constexpr):
    """One row of W: out[row, 2j], out[row, 2j + 1] = the low and high nibble of byte j,
    times the scale of its 32-value group (fp16 bit trick, see moe_gemv.py)."""
    row = tl.program_id(0).to(tl.int64)
    for b0 in range(0, half_k, BLOCK):
        j = b0 + tl.arange(0, BLOCK)
        ok = j < half_k
        raw = tl.load(blocks_ptr + row * half_k + j, mask=ok, other=0).to(tl.int16)
        sc = tl.load(scales_ptr + row * (half_k // 16) + j // 16, mask=ok, other=0)
        scale = ((tl.minimum(sc.to(tl.int32), 240) + 14) << 23).to(tl.float32, bitcast=True)
        lo = (((raw & 0x8) << 12) | ((raw & 0x7) << 9)).to(tl.float16, bitcast=True)
        hi = (((raw & 0x80) << 8) | ((raw & 0x70) << 5)).to(tl.float16, bitcast=True)
        dtype = out_ptr.dtype.element_ty
        tl.store(out_ptr + row * 2 * half_k + 2 * j, (lo.to(tl.float32) * scale).to(dtype), mask=ok)
        tl.store(
            out_ptr + row * 2 * half_k + 2 * j + 1, (hi.to(tl.float32) * scale).to(dtype), mask=ok
        )


def expand(blocks: torch.Tensor, scales: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """blocks [..., R, K / 32, 16] uint8, scales [..., R, K / 32] -> out [..., R, K]."""
    rows = out.numel() // out.shape[-1]
    half_k = out.shape[-1] // 2
    _expand_kernel[(rows,)](blocks, scales, out, half_k, BLOCK=512, num_warps=4)
    return out


@dataclass
class _Chunk:
    """What fused_moe reads of a MoE module: the experts [first, first + local), expanded."""

    w13: torch.Tensor
    w2: torch.Tensor
    b13: torch.Tensor
    b2: torch.Tensor
    first: int
    local: int
    inter: int
    alpha: float
    limit: float
    tp: object
    packed: bool = False


class _Sharded:  # a TPShard look-alike whose size > 1 makes fused_moe drop other experts
    size = 2


def expanded_moe(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, moe) -> torch.Tensor:
    from stator.engines.native.kernels.fused_moe import fused_moe

    hidden, inter, dtype = x.shape[1], moe.inter, x.dtype
    chunk = min(CHUNK, moe.local)
    w13 = torch.empty(chunk, 2 * inter, hidden, dtype=dtype, device=x.device)
    w2 = torch.empty(chunk, hidden, inter, dtype=dtype, device=x.device)
    y = None
    for c0 in range(0, moe.local, chunk):
        n = min(chunk, moe.local - c0)
        expand(moe.w13_blocks[c0 : c0 + n], moe.w13_scales[c0 : c0 + n], w13[:n])
        expand(moe.w2_blocks[c0 : c0 + n], moe.w2_scales[c0 : c0 + n], w2[:n])
        part = _Chunk(w13[:n], w2[:n], moe.b13[c0 : c0 + n], moe.b2[c0 : c0 + n],
                      moe.first + c0, n, inter, moe.alpha, moe.limit, _Sharded())  # fmt: skip
        out = fused_moe(x, weights, ids, part, allow_expand=False)
        y = out if y is None else y.add_(out)
    assert y is not None
    return y
