"""A PEFT LoRA adapter read from disk into host tensors, mapped onto the native model.

PEFT stores, per adapted projection, `lora_A` [r, in] and `lora_B` [out, r]; the delta is
`scale * B @ A` with `scale = alpha / r` (`alpha / sqrt(r)` with rsLoRA). The native model
fuses q/k/v and gate/up into one projection each, so an adapter is kept per *fused*
module: one A per shard (q, k, v) and that shard's rows of B. The scale is folded into B
once here, so the kernels compute `y += (x @ A^T) @ B^T` and nothing else.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stator.engines.base import EngineError

# PEFT names: base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight
_TENSOR = re.compile(r"(?:^|\.)layers\.(\d+)\.(\w+)\.(\w+)\.lora_([AB])(?:\.default)?\.weight$")
_UNSUPPORTED = {
    "use_dora": "DoRA",
    "use_qalora": "QA-LoRA",
    "lora_bias": "LoRA bias",
    "layer_replication": "layer replication",
    "target_parameters": "target_parameters",
    "trainable_token_indices": "trainable tokens",
}


@dataclass
class ModuleDelta:
    """One fused projection's low-rank parts: per shard index, (A [r, in], B [rows, r])
    with the scale folded into B."""

    shards: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


@dataclass
class LoraAdapter:
    name: str
    path: str
    rank: int  # the largest rank of any module
    # (layer index, fused module name under the layer: "self_attn.qkv_proj") -> delta
    modules: dict[tuple[int, str], ModuleDelta]

    def nbytes(self) -> int:
        return sum(
            a.numel() * a.element_size() + b.numel() * b.element_size()
            for delta in self.modules.values()
            for a, b in delta.shards.values()
        )


def read_adapter_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads((path / "adapter_config.json").read_text())
    except (OSError, ValueError) as exc:
        raise EngineError(f"cannot read {path / 'adapter_config.json'}: {exc}") from exc
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise EngineError(f"{path}: peft_type {config.get('peft_type')!r} is not LoRA")
    for key, what in _UNSUPPORTED.items():
        if config.get(key):
            raise EngineError(f"{path}: {what} adapters are not supported")
    if config.get("bias", "none") != "none":
        raise EngineError(
            f"{path}: adapters that train biases (bias={config['bias']!r}) are not supported"
        )
    if config.get("modules_to_save"):
        raise EngineError(f"{path}: modules_to_save {config['modules_to_save']} are not supported")
    if config.get("fan_in_fan_out"):
        raise EngineError(f"{path}: fan_in_fan_out adapters (Conv1D models) are not supported")
    return config


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    st = path / "adapter_model.safetensors"
    if st.is_file():
        from safetensors.torch import load_file

        return load_file(str(st))
    binary = path / "adapter_model.bin"
    if binary.is_file():
        return torch.load(str(binary), map_location="cpu", weights_only=True)
    raise EngineError(f"{path} has no adapter_model.safetensors (or adapter_model.bin)")


def _pattern_value(patterns: dict[str, Any], module: str, default: Any) -> Any:
    """PEFT's rank_pattern / alpha_pattern: a key matches a module name's suffix."""
    for key, value in patterns.items():
        if re.fullmatch(rf"(.*\.)?(?:{key})", module):
            return value
    return default


def load_adapter(
    name: str, path: Path, model: nn.Module, max_rank: int, dtype: torch.dtype
) -> LoraAdapter:
    """Read the adapter at `path` and map it onto `model`; EngineError for anything the
    engine cannot serve (so a failed load registers nothing)."""
    config = read_adapter_config(path)
    tensors = _read_tensors(path)
    packed: dict[str, tuple[str, Any]] = getattr(model, "packed_modules", {})
    layers = model.model.layers
    alpha_default = float(config.get("lora_alpha", config.get("r", 8)))
    rslora = bool(config.get("use_rslora"))
    parts: dict[tuple[int, str, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _TENSOR.search(key)
        if match is None:
            if "lora_" in key:
                raise EngineError(
                    f"{path}: adapter tensor {key!r} targets a module LoRA cannot serve here"
                )
            continue
        layer, block, proj, which = match.groups()
        parts.setdefault((int(layer), block, proj), {})[which] = tensor
    if not parts:
        raise EngineError(f"{path}: no LoRA tensors found")
    modules: dict[tuple[int, str], ModuleDelta] = {}
    top_rank = 0
    for (layer, block, proj), ab in sorted(parts.items()):
        if set(ab) != {"A", "B"}:
            raise EngineError(f"{path}: layer {layer} {proj} lacks lora_A or lora_B")
        if layer >= len(layers):
            raise EngineError(f"{path}: layer {layer} is beyond the model's {len(layers)} layers")
        fused, shard = packed.get(proj, (proj, None))
        module_name = f"{block}.{fused}"
        try:
            module = layers[layer].get_submodule(module_name)
        except AttributeError:
            raise EngineError(f"{path}: the model has no module {block}.{proj}") from None
        a, b = ab["A"], ab["B"]
        rank = a.shape[0]
        if rank > max_rank:
            raise EngineError(
                f"{path}: rank {rank} is above --max-lora-rank {max_rank}; raise it to serve this adapter"
            )
        slices = module.shard_slices() if hasattr(module, "shard_slices") else {}
        if shard is None:
            index, rows = 0, module.out_features
        else:
            index = list(slices).index(shard)
            rows = slices[shard].stop - slices[shard].start
        if a.shape != (rank, module.in_features) or b.shape != (rows, rank):
            raise EngineError(
                f"{path}: layer {layer} {proj}: shapes A {tuple(a.shape)}, B {tuple(b.shape)} do "
                f"not fit the model's ({rank}, {module.in_features}) and ({rows}, {rank})"
            )
        full_name = f"model.layers.{layer}.{block}.{proj}"
        r = _pattern_value(config.get("rank_pattern") or {}, full_name, config.get("r", rank))
        alpha = float(_pattern_value(config.get("alpha_pattern") or {}, full_name, alpha_default))
        scale = alpha / (math.sqrt(r) if rslora else r)
        delta = modules.setdefault((layer, module_name), ModuleDelta())
        delta.shards[index] = (
            a.to(torch.float32).to(dtype).contiguous(),
            (b.to(torch.float32) * scale).to(dtype).contiguous(),
        )
        top_rank = max(top_rank, rank)
    return LoraAdapter(name=name, path=str(path), rank=top_rank, modules=modules)


def pin_adapter(adapter: LoraAdapter) -> None:
    """Page-lock the host copies, so copies into device slots run asynchronously."""
    for delta in adapter.modules.values():
        delta.shards = {i: (a.pin_memory(), b.pin_memory()) for i, (a, b) in delta.shards.items()}
