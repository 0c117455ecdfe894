"""GPT-OSS routing on CUDA: the top k of each token's router logits and a softmax over
those k, in one launch (one program per token).

torch.topk + softmax took `gatherTopK`, `bitonicSortKVInPlace` and a softmax kernel: ~250 us
of a ~3.9 ms batch-1 decode step of 20B on an H100 (24 layers; benchmarks/README.md); this
kernel takes ~1.6 us a layer. The logits stay a cuBLAS GEMM: computing them here too (one
program streaming the router's [E, H] weight) measured no faster (62.3 against 61.0 us for
the whole batch-1 MoE layer, 2026-11-27). At a few rows the router's split-K GEMV may hand
over its float32 partial sums and bias (`epilogues.project`): they are summed here, as the
GEMV's own sum kernel would (rounded to the model dtype), one launch less a layer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stator.engines.native.kernels.moe_half2 import empty_pairs, write_pairs
from stator.engines.native.kernels.mxfp4_bf16 import write_pair_order


@triton.jit
def _route_kernel(
    logits_ptr, bias_ptr, weights_ptr, ids_ptr, num_experts, stride_l, split_stride, x_ptr,
    pairs_ptr, inv_ptr,
    TOP_K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr, X_LAYOUT: tl.constexpr,
    HIDDEN: tl.constexpr, H_PAD: tl.constexpr, SPLITS: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    # x in the layout the MoE's kernels read, one launch less: the streaming kernels' fp16
    # pairs (moe_half2.py) or the bit-wise grouped GEMMs' pair order (mxfp4_bf16.py).
    if X_LAYOUT == 1:
        write_pairs(x_ptr, pairs_ptr, inv_ptr, t, HIDDEN, H_PAD)
    elif X_LAYOUT == 2:
        write_pair_order(x_ptr, pairs_ptr, t, HIDDEN, H_PAD)
    es = tl.arange(0, E_PAD)
    e_ok = es < num_experts
    logits = tl.load(logits_ptr + t * stride_l + es, mask=e_ok, other=0.0).to(tl.float32)
    if SPLITS > 1 or HAS_BIAS:  # partial sums: summed, + bias, rounded as the GEMV's sum
        for s in tl.static_range(1, SPLITS):
            logits += tl.load(logits_ptr + s * split_stride + t * stride_l + es, mask=e_ok,
                              other=0.0)  # fmt: skip
        if HAS_BIAS:
            logits += tl.load(bias_ptr + es, mask=e_ok, other=0.0).to(tl.float32)
        logits = logits.to(bias_ptr.dtype.element_ty).to(tl.float32)
    logits = tl.where(e_ok, logits, float("-inf"))
    # k passes of arg-max (ties to the lower expert id, as torch.topk), collected in order.
    slot = tl.arange(0, K_PAD)
    top = tl.full([K_PAD], float("-inf"), tl.float32)
    ids = tl.zeros([K_PAD], tl.int32)
    for i in tl.static_range(TOP_K):
        best = tl.max(logits, axis=0)
        arg = tl.argmax(logits, axis=0)
        top = tl.where(slot == i, best, top)
        ids = tl.where(slot == i, arg, ids)
        logits = tl.where(es == arg, float("-inf"), logits)
    k_ok = slot < TOP_K
    p = tl.where(k_ok, tl.exp(top - tl.max(top, axis=0)), 0.0)
    tl.store(weights_ptr + t * TOP_K + slot, p / tl.sum(p, axis=0), mask=k_ok)
    tl.store(ids_ptr + t * TOP_K + slot, ids.to(tl.int64), mask=k_ok)


def route(
    logits: torch.Tensor,
    top_k: int,
    x: torch.Tensor | None = None,
    splits: int = 1,
    bias: torch.Tensor | None = None,
    x_layout: str = "half2",
) -> tuple[torch.Tensor, ...]:
    """(routing weights [T, k] float32, expert ids [T, k] int64) of router logits [T, E]:
    the same as torch.topk(logits, k) and a float32 softmax over those k. With x [T, H]:
    then also x in `x_layout`: "half2", moe_half2's pairs and their 2^-S
    (`moe_half2.half_pairs`); "pair_order", x as `mxfp4_bf16.pair_order` gives it. `splits` > 1
    or a `bias`: `logits` are float32 partial sums [S, T, E] (`epilogues.Parts`), summed
    with the bias and rounded to the bias's dtype first."""
    if splits > 1 or bias is not None:
        if bias is None or logits.dim() != 3 or logits.shape[0] != splits:
            raise ValueError("route: partial sums come as [splits, T, E] with their bias")
        if not logits.is_contiguous():
            raise ValueError("route: partial sums must be contiguous")
    tokens, experts = logits.shape[-2:]
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(tokens, top_k, dtype=torch.long, device=logits.device)
    layout = 0 if x is None else _X_LAYOUTS[x_layout]
    if x is None:
        pairs = inv = x_in = logits  # unused
        hidden = 0
    else:
        x_in = x.contiguous()
        hidden = x_in.shape[1]
        if layout == 1:
            pairs, inv = empty_pairs(x_in)
        else:
            pairs, inv = torch.empty_like(x_in), logits  # inv unused
    _route_kernel[(tokens,)](
        logits, bias if bias is not None else logits, weights, ids, experts, logits.stride(-2),
        tokens * experts, x_in, pairs, inv,
        TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k),
        E_PAD=triton.next_power_of_2(experts), X_LAYOUT=layout, HIDDEN=hidden,
        H_PAD=triton.next_power_of_2(max(hidden, 1)), SPLITS=splits, HAS_BIAS=bias is not None,
        num_warps=1 if x is None else 4,
    )  # fmt: skip
    if x is None:
        return weights, ids
    if layout == 2:
        return weights, ids, pairs
    return weights, ids, pairs.view(torch.int32), inv


_X_LAYOUTS = {"half2": 1, "pair_order": 2}
