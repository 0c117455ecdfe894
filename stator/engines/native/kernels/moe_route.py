"""GPT-OSS routing on CUDA in one kernel per layer: a token's router logits (x @ W^T + b,
rounded to the model dtype as the Linear's output is), its top k, a softmax over those k.

Unfused, the same work took a cuBLAS GEMV with its split-K reduction, `gatherTopK`,
`bitonicSortKVInPlace` and a softmax: ~400 us of a ~3.9 ms batch-1 decode step of 20B on an
H100 (24 layers x 5 launches of a few us each; benchmarks/README.md). One program per token
reads the router's [E, H] weight (184 KB for 20B) from L2; from `LINEAR_MAX_TOKENS` tokens on
the logits come from cuBLAS (one GEMM beats T programs re-reading W) and only the top-k and
softmax run here. The same program can write the token's activations in the order the MXFP4
streaming kernels read them (`moe_gemv.permute`), which saves that kernel a pass.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LINEAR_MAX_TOKENS = 64
# Router weight elements per step of the in-kernel logits ([E, TILE / E] tiles, 8 warps).
TILE = 16384


@triton.jit
def _route_kernel(
    x_ptr, w_ptr, b_ptr, logits_ptr, weights_ptr, ids_ptr, perm_ptr,
    hidden, num_experts, stride_x, stride_l,
    TOP_K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr, BLOCK_H: tl.constexpr,
    LINEAR: tl.constexpr, PERMUTE: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    es = tl.arange(0, E_PAD)
    e_ok = es < num_experts
    if LINEAR:
        dtype = x_ptr.dtype.element_ty
        acc = tl.zeros([E_PAD], tl.float32)
        # One program streams all of W (from L2): the next tile's loads are issued before
        # this one is reduced, so two are in flight (one at a time took ~30 us a layer).
        hs = tl.arange(0, BLOCK_H)
        w_at = w_ptr + es[:, None] * hidden + hs[None, :]
        w_next = tl.load(w_at, mask=e_ok[:, None] & (hs < hidden)[None, :], other=0.0)
        for h0 in range(0, hidden, BLOCK_H):
            hs = h0 + tl.arange(0, BLOCK_H)
            h_ok = hs < hidden
            w = w_next
            n_ok = (hs + BLOCK_H) < hidden
            w_next = tl.load(w_at + h0 + BLOCK_H, mask=e_ok[:, None] & n_ok[None, :], other=0.0)
            xh = tl.load(x_ptr + t * stride_x + hs, mask=h_ok, other=0.0)
            if PERMUTE:  # moe_gemv.permute's order: value k at (k % 8) * H / 8 + k // 8
                to = (hs % 8) * (hidden // 8) + hs // 8
                tl.store(perm_ptr + t * hidden + to, xh.to(perm_ptr.dtype.element_ty), mask=h_ok)
            acc += tl.sum(w.to(tl.float32) * xh.to(tl.float32)[None, :], axis=1)
        bias = tl.load(b_ptr + es, mask=e_ok, other=0.0).to(tl.float32)
        logits = (acc + bias).to(dtype).to(tl.float32)
    else:
        logits = tl.load(logits_ptr + t * stride_l + es, mask=e_ok, other=0.0).to(tl.float32)
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
    p = tl.exp(top - tl.max(top, axis=0))
    p = tl.where(slot < TOP_K, p, 0.0)
    k_ok = slot < TOP_K
    tl.store(weights_ptr + t * TOP_K + slot, p / tl.sum(p, axis=0), mask=k_ok)
    tl.store(ids_ptr + t * TOP_K + slot, ids.to(tl.int64), mask=k_ok)


def route(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int, permute: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(routing weights [T, k] float32, expert ids [T, k] int64, and with `permute` the
    activations in the MXFP4 streaming kernels' order (`moe_gemv.permute`), else None)."""
    tokens, hidden = x.shape
    experts = weight.shape[0]
    x = x.contiguous()
    dev = x.device
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=dev)
    ids = torch.empty(tokens, top_k, dtype=torch.long, device=dev)
    linear = tokens <= LINEAR_MAX_TOKENS
    perm = torch.empty_like(x) if permute else None
    if permute and not linear:
        from stator.engines.native.kernels.moe_gemv import permute as permute_rows

        perm = permute_rows(x)
    logits = x if linear else torch.nn.functional.linear(x, weight, bias)
    e_pad = triton.next_power_of_2(experts)
    _route_kernel[(tokens,)](
        x, weight, bias, logits, weights, ids, perm if perm is not None else weights,
        hidden, experts, x.stride(0), logits.stride(0),
        TOP_K=top_k, K_PAD=triton.next_power_of_2(top_k), E_PAD=e_pad,
        BLOCK_H=max(16, min(1024, TILE // e_pad)), LINEAR=linear, PERMUTE=permute and linear,
        num_warps=8 if linear else 1,
    )  # fmt: skip
    return weights, ids, perm
