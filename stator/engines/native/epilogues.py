"""Projections whose output the next op finishes (`kernels/epilogues.py`): on CUDA, a dense
decoder layer hands each projection's split-K partial sums to the kernel that consumes
them (RoPE + KV store, residual add + RMSNorm, SiLU-and-multiply) instead of summing them
in a kernel of their own. Fewer launches per layer is what batch-1 decode is short of.

`STATOR_FUSED_EPILOGUES=0` turns it off (read at import; `ENABLED` may be flipped before
graphs are captured: the benchmarks compare both in one process). The CPU never takes it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from stator.engines.native.context import current_lora
from stator.engines.native.kernels.gemv import MAX_ROWS

ENABLED = os.environ.get("STATOR_FUSED_EPILOGUES", "1") != "0"


@dataclass(frozen=True)
class Parts:
    """A projection's output, maybe not yet summed: `splits` float32 partial sums
    [S, M, N] still missing `bias`, or (splits 1, bias None) the output [M, N] itself."""

    data: torch.Tensor
    splits: int
    bias: torch.Tensor | None

    def tensor(self, dtype: torch.dtype) -> torch.Tensor:
        """The finished output [M, N] (for a consumer without a fused kernel)."""
        if self.splits == 1 and self.bias is None:
            return self.data
        from stator.engines.native.kernels.gemv import sum_splits

        out = torch.empty(self.data.shape[1:], dtype=dtype, device=self.data.device)
        return sum_splits(self.data, self.bias, out)


def active(x: torch.Tensor) -> bool:
    return ENABLED and x.is_cuda


def project(linear: nn.Module, x: torch.Tensor) -> Parts:
    """`linear(x)` as Parts: the split-K GEMV's partials where `linear.forward` would run
    that GEMV with more than one split (no LoRA adapter in the step, no all-reduce after),
    else the finished output."""
    cfg = getattr(linear, "gemv_config", None)
    tp = getattr(linear, "tp", None)
    if (
        cfg is not None
        and cfg.split_k > 1
        and x.dim() == 2
        and x.shape[0] <= MAX_ROWS
        and x.stride(1) == 1
        and (linear.lora is None or current_lora() is None)
        and (tp is None or tp.size == 1)
    ):
        from stator.engines.native.kernels.gemv import gemv

        return Parts(gemv(x, linear.weight, cfg, reduce=False), cfg.split_k, linear.bias)
    return Parts(linear(x), 1, None)


def add_rms_norm(norm: nn.Module, x: Parts, residual: torch.Tensor) -> torch.Tensor:
    """`norm(x, residual)` (residual += x, then normalize) with x's sum in the same kernel."""
    from stator.engines.native.kernels import epilogues

    return epilogues.add_rms_norm(x.data, x.splits, x.bias, residual, norm.weight, norm.eps)


def gated_mlp(mlp: nn.Module, x: torch.Tensor) -> Parts:
    """`mlp(x)` of a GatedMLP, its down projection's output left for the next norm."""
    from stator.engines.native.kernels import epilogues

    gate_up = project(mlp.gate_up_proj, x)
    if gate_up.bias is None:
        act = epilogues.silu_mul(gate_up.data, gate_up.splits, x.dtype)
    else:  # a biased gate/up (no Llama-family model has one): sum first
        from stator.engines.native.kernels.elementwise import silu_mul

        act = silu_mul(gate_up.tensor(x.dtype))
    return project(mlp.down_proj, act)
