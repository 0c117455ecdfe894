"""Load a Hugging Face checkpoint (single or sharded safetensors) into a native model.

Loading is data: each checkpoint tensor name is mapped through the model's
`packed_modules` table to a parameter and a shard, and the parameter's own `weight_loader`
puts it in place. Every parameter must be loaded exactly once; anything else is an error.
Tensors arrive as lazy safetensors slices: a tensor-parallel layer reads only its rank's
rows or columns from the file (sharding.py), so no rank holds the whole model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from stator.engines.native.sharding import read_all, shape_of

# Buffers some checkpoints carry that the model recomputes itself.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir} has no *.safetensors weights")
    return files


def iter_tensors(model_dir: str | Path) -> Iterator[tuple[str, Any]]:
    """(name, lazy slice) of every checkpoint tensor; index a slice to read from the file."""
    for path in checkpoint_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118  (safe_open has no __iter__)
                yield name, f.get_slice(name)


def load_weights(model: nn.Module, model_dir: str | Path) -> None:
    params = dict(model.named_parameters())
    packed: dict[str, tuple[str, object]] = getattr(model, "packed_modules", {})
    tied = bool(getattr(getattr(model, "spec", None), "tie_word_embeddings", False))
    loaded: set[tuple[str, object]] = set()
    tensors = iter_tensors(model_dir)
    # A model whose checkpoint layout differs from its parameters translates the stream.
    mapper = getattr(model, "map_checkpoint", None)
    for name, tensor in mapper(tensors) if mapper is not None else tensors:
        if name.endswith(_IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
            continue
        target, shard = name, None
        for ckpt_part, (fused_part, shard_id) in packed.items():
            if f".{ckpt_part}." in name:
                target, shard = name.replace(f".{ckpt_part}.", f".{fused_part}."), shard_id
                break
        param = params.get(target)
        if param is None:
            raise ValueError(f"checkpoint tensor {name!r} has no place in the model")
        loader = getattr(param, "weight_loader", None)
        with torch.no_grad():
            if loader is None:
                if tuple(param.shape) != shape_of(tensor):
                    raise ValueError(
                        f"{name}: shape {shape_of(tensor)} != expected {tuple(param.shape)}"
                    )
                param.data.copy_(read_all(tensor))
            else:
                loader(param, tensor, shard)
        loaded.add((target, shard))
    missing = [
        f"{n}[{shard}]" if shard is not None else n
        for n, p in params.items()
        for shard in getattr(p, "shard_ids", [None])
        if (n, shard) not in loaded
    ]
    if missing:
        raise ValueError(f"checkpoint lacks weights for: {', '.join(missing[:8])}")


@torch.no_grad()
def init_dummy_weights(model: torch.nn.Module) -> None:
    """Random weights of a trained model's scale (for benchmarks without a checkpoint):
    norms at 1, everything else N(0, 0.02); modules with an `init_dummy` (packed experts)
    fill their own."""
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(0)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif p.is_floating_point():
            p.normal_(0.0, 0.02, generator=gen)
    for module in model.modules():
        if hasattr(module, "init_dummy"):
            module.init_dummy(gen)
