"""GPT-OSS's mixture of experts: a linear router with bias picks the top-k experts of each
token and softmaxes over those k logits; each expert is a SwiGLU with clamps and biases.

Experts are held as `w13` [E, 2I, H] (the gate's I rows, then the up's: the checkpoint
interleaves them, and the loader de-interleaves, so the activation reads two halves) and
`w2` [E, H, I], in the model dtype ("bf16", expanded) or packed MXFP4 (`mxfp4.py`) with the
dequantization inside the fused kernel. Tensor parallelism splits the experts whole
(expert parallel): rank r holds experts [r * E / n, (r + 1) * E / n), every rank routes
every token, computes its own experts' share (their biases included) and one all-reduce
sums the ranks. On the CPU the experts run one by one in PyTorch (the reference); on CUDA
the top-k and softmax run in one kernel (`kernels/moe_route.py`) and the fused Triton MoE
(`kernels/fused_moe.py`) runs them all.
"""

from __future__ import annotations

import torch
from torch import nn

from stator.engines.native import epilogues, mxfp4, parallel
from stator.engines.native.config import ModelSpec
from stator.engines.native.layers import Linear


class MoE(nn.Module):
    def __init__(self, spec: ModelSpec, packed: bool) -> None:
        super().__init__()
        hidden, inter = spec.hidden_size, spec.intermediate_size
        self.tp = spec.tp
        self.num_experts, self.top_k = spec.num_experts, spec.experts_per_token
        self.local = spec.num_experts // spec.tp.size
        self.first = spec.tp.rank * self.local
        self.inter = inter
        self.alpha = float(spec.raw.get("swiglu_alpha", 1.702))
        self.limit = float(spec.raw.get("swiglu_limit", 7.0))
        self.packed = packed
        self.router = Linear(hidden, spec.num_experts, bias=True)
        n = self.local

        def param(*shape: int, dtype: torch.dtype | None = None) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)

        if packed:
            if hidden % mxfp4.GROUP or inter % mxfp4.GROUP:
                raise ValueError("MXFP4 experts need hidden and intermediate sizes of 32s")
            u8 = torch.uint8
            self.w13_blocks = param(n, 2 * inter, hidden // 32, 16, dtype=u8)
            self.w13_scales = param(n, 2 * inter, hidden // 32, dtype=u8)
            self.w2_blocks = param(n, hidden, inter // 32, 16, dtype=u8)
            self.w2_scales = param(n, hidden, inter // 32, dtype=u8)
        else:
            self.w13 = param(n, 2 * inter, hidden)
            self.w2 = param(n, hidden, inter)
        self.b13 = param(n, 2 * inter)
        self.b2 = param(n, hidden)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k] in float32, expert ids [T, k]) of each token."""
        logits = self.router(x)
        if logits.is_cuda:
            from stator.engines.native.kernels.moe_route import route

            return route(logits, self.top_k)
        top, ids = torch.topk(logits, self.top_k, dim=-1)
        return torch.softmax(top.float(), dim=-1), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            from stator.engines.native.kernels import fused_moe as fm
            from stator.engines.native.kernels.moe_route import route

            # The router kernel also writes x in the layout the MoE's kernels read it in
            # (the streaming kernels' fp16 pairs, the bit-wise GEMMs' pair order), where
            # they take one: one launch less a layer. With fused epilogues it also sums the
            # router GEMV's split-K partials: one more.
            layout = fm.x_layout(x, self)
            x_in, as_layout = (None, "half2") if layout is None else (x, layout)
            if epilogues.active(x):
                logits = epilogues.project(self.router, x)
                weights, ids, *x_as = route(logits.data, self.top_k, x_in, logits.splits,
                                            logits.bias, as_layout)  # fmt: skip
            else:
                weights, ids, *x_as = route(self.router(x), self.top_k, x_in, x_layout=as_layout)
            y = fm.fused_moe(x, weights, ids, self, x_as=tuple(x_as) if x_as else None)
        else:
            weights, ids = self.route(x)
            y = self._reference(x, weights, ids)
        return parallel.all_reduce(y) if self.tp.size > 1 else y

    def expert_weights(self, e: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Local expert e's (w13 [2I, H], w2 [H, I]) in the model dtype."""
        if not self.packed:
            return self.w13[e], self.w2[e]
        dtype = self.b13.dtype
        w13 = mxfp4.dequantize(self.w13_blocks[e], self.w13_scales[e], dtype)
        return w13, mxfp4.dequantize(self.w2_blocks[e], self.w2_scales[e], dtype)

    def activation(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = h[..., : self.inter], h[..., self.inter :]
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return gate * torch.sigmoid(gate * self.alpha) * (up + 1)

    def _reference(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor):
        y = torch.zeros_like(x)
        local = ids - self.first
        for e in torch.unique(local).tolist():
            if not 0 <= e < self.local:
                continue
            rows, slots = torch.where(local == e)
            w13, w2 = self.expert_weights(e)
            h = self.activation(x[rows] @ w13.T + self.b13[e])
            out = h @ w2.T + self.b2[e]
            y.index_add_(0, rows, out * weights[rows, slots, None].to(out.dtype))
        return y

    @torch.no_grad()
    def init_dummy(self, generator: torch.Generator) -> None:
        """Random weights of a trained model's scale (`--load-format dummy`)."""
        if self.packed:
            for name in ("w13", "w2"):
                blocks, scales = getattr(self, f"{name}_blocks"), getattr(self, f"{name}_scales")
                shape = (*blocks.shape[:-2], blocks.shape[-2] * 32)
                b, s = mxfp4.random_packed(shape, generator, blocks.device)
                blocks.copy_(b)
                scales.copy_(s)
        else:
            self.w13.normal_(0.0, 0.02, generator=generator)
            self.w2.normal_(0.0, 0.02, generator=generator)
        for p in (self.b13, self.b2, self.router.weight, self.router.bias):
            p.normal_(0.0, 0.02, generator=generator)
