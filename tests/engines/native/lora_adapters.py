"""Tiny PEFT LoRA adapters for the tiny test models, and their merged reference models."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_adapter(
    hf_model: torch.nn.Module, path: Path, *, seed: int, **config: Any
) -> tuple[Path, torch.nn.Module]:
    """Write a PEFT adapter of `hf_model` with random A and B to `path`; returns (dir,
    the base model with the adapter merged in)."""
    from peft import LoraConfig, get_peft_model

    options = {"r": 8, "lora_alpha": 16, "target_modules": ALL_MODULES, **config}
    peft_model = get_peft_model(copy.deepcopy(hf_model), LoraConfig(**options))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    peft_model.save_pretrained(str(path))
    merged = peft_model.merge_and_unload().eval()
    return path, merged


def write_random_adapter(
    path: Path,
    config: dict[str, Any],
    *,
    rank: int,
    seed: int,
    alpha: float | None = None,
    targets: list[str] | None = None,
    scale: float = 0.02,
    dtype: torch.dtype = torch.bfloat16,
) -> Path:
    """A PEFT-format adapter of random weights for a Llama-shaped `config` (a config.json
    dict), written without PEFT (benchmarks and GPU machines need not have it)."""
    import json

    from safetensors.torch import save_file

    targets = targets or ALL_MODULES
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config.get("num_key_value_heads")
    head_dim = config.get("head_dim") or hidden // heads
    q, kv = heads * head_dim, (kv_heads or heads) * head_dim
    shapes = {  # module: (in, out)
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for module in targets:
            block = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            fan_in, fan_out = shapes[module]
            prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (
                torch.randn(rank, fan_in, generator=gen) * scale
            ).to(dtype)
            tensors[f"{prefix}.lora_B.weight"] = (
                torch.randn(fan_out, rank, generator=gen) * scale
            ).to(dtype)
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA",
        "r": rank,
        "lora_alpha": alpha if alpha is not None else 2 * rank,
        "target_modules": targets,
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }
    (path / "adapter_config.json").write_text(json.dumps(adapter_config))
    return path
