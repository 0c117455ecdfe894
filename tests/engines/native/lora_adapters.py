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
