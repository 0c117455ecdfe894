"""Building blocks of the decoder models: norms, rotary embeddings, the gated MLP and the
linear layers that know how to load their (fused) weights from a checkpoint."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stator.engines.native.context import current_lora
from stator.engines.native.sharding import read_all


def _fused_kernels(x: torch.Tensor) -> bool:
    """The Triton element-wise kernels serve CUDA tensors; the CPU keeps PyTorch ops."""
    return x.is_cuda


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """Normalize x, or with `residual`: residual += x in place, then normalize it."""
        if _fused_kernels(x) and x.dim() == 2:
            from stator.engines.native.kernels.elementwise import rms_norm

            return rms_norm(x, self.weight, self.eps, residual)
        if residual is not None:
            x = residual.add_(x)
        if x.dtype == torch.float32:  # one fused kernel; same arithmetic in float32
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Normalize in float32 and scale in the input dtype, as the reference models do.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def _default_loader(param: nn.Parameter, loaded: Any, shard: Any = None) -> None:
    loaded = read_all(loaded)  # a tensor or a lazy safetensors slice (sharding.py)
    if param.shape != loaded.shape:
        raise ValueError(f"weight shape {tuple(loaded.shape)} != expected {tuple(param.shape)}")
    param.data.copy_(loaded)


class Linear(nn.Linear):
    """nn.Linear whose parameters carry a `weight_loader` (how a checkpoint tensor lands).
    On CUDA a measured split-K GEMV config (`kernels/gemv.py`) may serve batches of at
    most 8 rows; `gemv_config` stays None where cuBLAS is as fast."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.gemv_config: Any = None
        # How a fused consumer takes this projection's output ("", "parts", "gated":
        # `epilogues.py`), set by the model; and the GEMV config chosen for that.
        self.epilogue = ""
        self.epilogue_gemv: Any = None
        # The LoRA adapter slots of this projection (`lora/slots.py`), when LoRA is on.
        self.lora: Any = None
        for p in self.parameters():
            p.weight_loader = self.load_shard  # type: ignore[attr-defined]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # LoRA's shrink goes first, while x (just written) is still in L2; the base matmul
        # streams its weights through L2 after it.
        batch = current_lora() if self.lora is not None else None
        pending = self.lora.shrink(x, batch) if batch is not None else None
        cfg = self.gemv_config
        if cfg is not None and x.dim() == 2 and x.shape[0] <= 8 and x.stride(1) == 1:
            from stator.engines.native.kernels.gemv import gemv

            y = gemv(x, self.weight, cfg, self.bias)
        else:
            y = super().forward(x)
        if pending is not None:
            y = self.lora.expand(pending, y, batch)
        return y

    def shard_slices(self) -> dict[Any, slice]:
        return {}

    def load_shard(self, param: nn.Parameter, loaded: Any, shard: Any = None) -> None:
        if shard is None:
            _default_loader(param, loaded)
            return
        loaded = read_all(loaded)
        rows = self.shard_slices()[shard]
        target = param.data[rows]
        if target.shape != loaded.shape:
            raise ValueError(
                f"shard {shard!r}: shape {tuple(loaded.shape)} != expected {tuple(target.shape)}"
            )
        target.copy_(loaded)


class MergedLinear(Linear):
    """Several projections of one input fused into one matmul (q/k/v, gate/up); a
    checkpoint's separate tensors are loaded into consecutive row ranges."""

    def __init__(self, in_features: int, shards: dict[Any, int], bias: bool = False) -> None:
        super().__init__(in_features, sum(shards.values()), bias=bias)
        self._slices: dict[Any, slice] = {}
        start = 0
        for name, size in shards.items():
            self._slices[name] = slice(start, start + size)
            start += size
        self.sizes = list(shards.values())
        for p in self.parameters():
            p.shard_ids = list(shards)  # type: ignore[attr-defined]  (all must be loaded)

    def shard_slices(self) -> dict[Any, slice]:
        return self._slices


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), with gate and up fused into one projection (its first
    half the gate). The model builds the projections (split over ranks or not)."""

    def __init__(self, gate_up_proj: nn.Module, down_proj: nn.Module) -> None:
        super().__init__()
        self.gate_up_proj = gate_up_proj
        self.down_proj = down_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if _fused_kernels(gate_up):
            from stator.engines.native.kernels.elementwise import silu_mul

            return self.down_proj(silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies of rotary embeddings, with the supported scaling schemes."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    kind = scaling["rope_type"]
    factor = float(scaling.get("factor", 1.0))
    if kind == "linear":
        return inv_freq / factor
    if kind == "llama3":
        # Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between.
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(medium, blended, scaled)
    if kind == "yarn":
        return _yarn_inv_freq(inv_freq, head_dim, theta, factor, scaling)
    raise ValueError(f"unsupported rope scaling {kind!r}; supported: default, linear, llama3, yarn")


def _yarn_inv_freq(
    inv_freq: torch.Tensor, dim: int, theta: float, factor: float, scaling: dict[str, Any]
) -> torch.Tensor:
    """YaRN: extrapolate the dimensions that rotate often within the original context,
    interpolate (divide by `factor`) the slow ones, ramp linearly in between."""
    old_len = float(scaling["original_max_position_embeddings"])
    fast, slow = float(scaling.get("beta_fast") or 32), float(scaling.get("beta_slow") or 1)

    def dim_of(rotations: float) -> float:
        return dim * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(fast), dim_of(slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolate = 1 - ramp
    return inv_freq / factor * (1 - extrapolate) + inv_freq * extrapolate


def rope_attention_factor(scaling: dict[str, Any] | None) -> float:
    """What YaRN multiplies cos and sin by (1 for every other scheme)."""
    if scaling is None or scaling["rope_type"] != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = float(scaling.get("factor", 1.0))
    mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")

    def get(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if mscale and mscale_all:
        return get(factor, float(mscale)) / get(factor, float(mscale_all))
    return get(factor)


class RotaryEmbedding(nn.Module):
    """Rotate-half rotary embeddings with a precomputed cos/sin table per position."""

    def __init__(
        self, head_dim: int, max_positions: int, theta: float, scaling: dict[str, Any] | None
    ) -> None:
        super().__init__()
        inv_freq = rope_inv_freq(head_dim, theta, scaling)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        factor = rope_attention_factor(scaling)
        self.register_buffer("cos", emb.cos() * factor, persistent=False)
        self.register_buffer("sin", emb.sin() * factor, persistent=False)
        # One table lookup per step, shared by every layer (positions are the same tensor).
        self._cached: tuple[torch.Tensor, torch.dtype, torch.Tensor, torch.Tensor] | None = None

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if _fused_kernels(q) and q.stride(1) == q.shape[2] and k.stride(1) == k.shape[2]:
            from stator.engines.native.kernels.elementwise import rope_

            rope_(q, k, self.cos, self.sin, positions)  # in place, one kernel for both
            return q, k
        cached = self._cached
        if cached is not None and cached[0] is positions and cached[1] == q.dtype:
            cos, sin = cached[2], cached[3]
        else:
            cos = self.cos[positions].unsqueeze(1).to(q.dtype)  # [T, 1, D]
            sin = self.sin[positions].unsqueeze(1).to(q.dtype)
            self._cached = (positions, q.dtype, cos, sin)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)
