"""The fused MoE's last step: each token's k expert outputs (the down kernel writes one row
per (token, expert) pair, `fused_moe.py`) summed into its output row, in one launch.

`out.view(T, k, H).sum(1)` did the same through PyTorch's generic strided reduction: 186 us
of a 13.3 ms decode step of GPT-OSS-20B at batch 256 on an H100 (7.8 us a layer for 5.9 MB
read and 1.5 MB written, ~2.5 us at the copy rate; benchmarks/README.md, issue 16, sixth
session). Here each program adds the k rows of one token's slice in float32, in pair order
(k = 0 first), and rounds once, as that reduction does (the order of four additions may
differ from it in the last bit).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Values of a row per program: 16 bytes a thread at 4 warps (bf16), three programs a row of
# GPT-OSS's 2,880.
BLOCK = 1024


@triton.jit
def _combine_kernel(pairs_ptr, out_ptr, hidden, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = h < hidden
    row = pairs_ptr + t * TOP_K * hidden + h
    acc = tl.load(row, mask=ok, other=0.0).to(tl.float32)
    for k in tl.static_range(1, TOP_K):
        acc += tl.load(row + k * hidden, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + t * hidden + h, acc.to(out_ptr.dtype.element_ty), mask=ok)


def combine(pair_out: torch.Tensor, top_k: int) -> torch.Tensor:
    """[T * k, H] (the k pairs of token t at rows t * k .. t * k + k - 1) -> [T, H], the sum
    of each token's k rows."""
    pairs, hidden = pair_out.shape
    tokens = pairs // top_k
    out = torch.empty(tokens, hidden, dtype=pair_out.dtype, device=pair_out.device)
    if tokens:
        _combine_kernel[(tokens, triton.cdiv(hidden, BLOCK))](
            pair_out, out, hidden, TOP_K=top_k, BLOCK=BLOCK, num_warps=4
        )
    return out
