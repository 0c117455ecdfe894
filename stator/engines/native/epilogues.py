"""Projections whose output the next op finishes (`kernels/epilogues.py`): on CUDA, a dense
decoder layer hands each projection's split-K partial sums to the kernel that consumes
them (RoPE + KV store, residual add + RMSNorm, SiLU-and-multiply) instead of summing them
in a kernel of their own. Fewer launches per layer is what batch-1 decode is short of.
Each projection's GEMV config is chosen for that use at start-up (`gemv.choose` with its
`epilogue`: timed without the sum kernel; gate/up with SiLU-and-multiply in the GEMV's own
epilogue), so shapes where cuBLAS won only by its one launch now take the split-K GEMV.

Measured on an H100 (8B shape, bf16, 4k vocabulary, `benchmarks/decode_b1_profile.py`):
batch-1 decode 180.1 tok/s against 170.8 unfused in the same process (1.055x), 312
kernels a step against 472; the decode step at batch 256 unchanged (15.18 ms both).

`STATOR_FUSED_EPILOGUES=0` turns it off (read at import; `ENABLED` may be flipped before
graphs are captured: the benchmarks compare both in one process). The CPU never takes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from stator.engines.native.context import current_lora
from stator.engines.native.kernels import switches

ENABLED = switches.flag("STATOR_FUSED_EPILOGUES", True)


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


def _gemv_eligible(linear: nn.Module, x: torch.Tensor) -> bool:
    """Whether the layer's own split-K GEMV config may serve x: a few contiguous rows, no
    LoRA adapter in the step, no all-reduce after (`Linear.forward` runs the rest)."""
    from stator.engines.native.kernels.gemv import MAX_ROWS  # Triton: CUDA steps only

    tp = getattr(linear, "tp", None)
    return (
        bool(getattr(linear, "epilogue", ""))
        and x.dim() == 2
        and x.shape[0] <= MAX_ROWS
        and x.stride(1) == 1
        and (linear.lora is None or current_lora() is None)
        and (tp is None or tp.size == 1)
    )


def project(linear: nn.Module, x: torch.Tensor) -> Parts:
    """`linear(x)` as Parts, with the GEMV config chosen for its epilogue at start-up
    (`linear.epilogue_gemv`, timed without the sum: `gemv.choose`): its partial sums
    when that has more than one split; cuBLAS's output where none was chosen."""
    if not _gemv_eligible(linear, x):
        return Parts(linear(x), 1, None)
    from stator.engines.native.kernels.gemv import gemv

    cfg = linear.epilogue_gemv
    if cfg is None:
        return Parts(F.linear(x, linear.weight, linear.bias), 1, None)
    if cfg.split_k == 1:
        return Parts(gemv(x, linear.weight, cfg, linear.bias), 1, None)
    return Parts(gemv(x, linear.weight, cfg, reduce=False), cfg.split_k, linear.bias)


def add_rms_norm(norm: nn.Module, x: Parts, residual: torch.Tensor) -> torch.Tensor:
    """`norm(x, residual)` (residual += x, then normalize) with x's sum in the same kernel."""
    from stator.engines.native.kernels import epilogues

    return epilogues.add_rms_norm(x.data, x.splits, x.bias, residual, norm.weight, norm.eps)


def gated_mlp(mlp: nn.Module, x: torch.Tensor) -> Parts:
    """`mlp(x)` of a GatedMLP, its down projection's output left for the next norm. With
    a gated GEMV config and one split, SiLU-and-multiply is the GEMV's own epilogue."""
    from stator.engines.native.kernels import epilogues
    from stator.engines.native.kernels.gemv import gemv

    gate_up = mlp.gate_up_proj
    cfg = gate_up.epilogue_gemv if _gemv_eligible(gate_up, x) else None
    if cfg is not None and gate_up.epilogue == "gated" and gate_up.bias is None:
        if cfg.split_k == 1:
            act = gemv(x, gate_up.weight, cfg, gated=True)
        else:
            parts = gemv(x, gate_up.weight, cfg, reduce=False, gated=True)
            act = epilogues.silu_mul(parts, cfg.split_k, x.dtype)
    else:
        y = project(gate_up, x).tensor(x.dtype)
        act = epilogues.silu_mul(y, 1, x.dtype)
    return project(mlp.down_proj, act)
