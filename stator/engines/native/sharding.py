"""How a model is cut across tensor-parallel ranks (Megatron style), as pure shape math.

Each rank holds `num_heads / size` query heads and the KV heads they read: a contiguous
block of KV heads when `size` divides `num_kv_heads`, otherwise (`size` > `num_kv_heads`)
one KV head that `size / num_kv_heads` neighbouring ranks each hold a copy of. The MLP's
intermediate dimension is split evenly (a mixture of experts instead gives each rank
`num_experts / size` whole experts), and the vocabulary in blocks of
`ceil(vocab / size)` rows (the last block padded). `shard_spec` turns the model's shape
into the shape one rank builds, so the model code and the KV cache sizing see only their
own heads; the checkpoint loader asks `TPShard` which rows or columns of a tensor to read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # no torch at import: config.py (flag parsing) imports this module
    import torch

    from stator.engines.native.config import ModelSpec


@dataclass(frozen=True)
class TPShard:
    """Which part of the model one rank holds. size == 1: all of it."""

    rank: int = 0
    size: int = 1
    # How many ranks hold a copy of the same KV heads (> 1 only when size > num_kv_heads).
    kv_replicas: int = 1

    def block(self, local: int) -> slice:
        """This rank's block of a dimension split evenly into `size` blocks of `local`."""
        return slice(self.rank * local, (self.rank + 1) * local)

    def kv_block(self, local: int) -> slice:
        """This rank's block of the KV heads' rows (shared by `kv_replicas` ranks)."""
        group = self.rank // self.kv_replicas
        return slice(group * local, (group + 1) * local)

    def vocab_block(self, vocab: int) -> tuple[int, int]:
        """(first token id, rows per rank) of this rank's vocabulary block."""
        per_rank = -(-vocab // self.size)
        return self.rank * per_rank, per_rank


def check_divisible(spec: ModelSpec, size: int) -> None:
    """A clear error at start for a model that cannot be split `size` ways."""
    if size < 1:
        raise ValueError(f"--tensor-parallel-size must be at least 1, got {size}")
    if size == 1:
        return
    problems = []
    if spec.num_heads % size:
        problems.append(f"num_attention_heads={spec.num_heads}")
    kv = spec.num_kv_heads
    if kv % size and size % kv:
        problems.append(f"num_key_value_heads={kv} (needs a multiple or a divisor of {size})")
    if spec.num_experts:  # experts are split across ranks whole (expert parallel)
        if spec.num_experts % size:
            problems.append(f"num_local_experts={spec.num_experts}")
    elif spec.intermediate_size % size:
        problems.append(f"intermediate_size={spec.intermediate_size}")
    if problems:
        raise ValueError(
            f"--tensor-parallel-size {size} does not divide {spec.architecture}'s "
            + ", ".join(problems)
        )


def shard_spec(spec: ModelSpec, rank: int, size: int) -> ModelSpec:
    """The shape rank `rank` of `size` builds: its heads and its slice of the MLP."""
    check_divisible(spec, size)
    if size == 1:
        return spec
    kv = spec.num_kv_heads
    return dataclasses.replace(
        spec,
        num_heads=spec.num_heads // size,
        num_kv_heads=max(1, kv // size),
        # A mixture of experts keeps whole experts per rank (see models/moe.py).
        intermediate_size=spec.intermediate_size // (1 if spec.num_experts else size),
        tp=TPShard(rank=rank, size=size, kv_replicas=max(1, size // kv)),
    )


# -- reading parts of checkpoint tensors ----------------------------------------------------
# The loader hands each weight loader either a tensor or a lazy safetensors slice
# (`safe_open(...).get_slice(name)`): indexing a slice reads only those bytes from the file,
# so a rank never holds more of a tensor than its shard.


def _is_lazy(loaded: Any) -> bool:
    return hasattr(loaded, "get_shape")  # a safetensors slice, not yet read


def shape_of(loaded: Any) -> tuple[int, ...]:
    return tuple(loaded.get_shape()) if _is_lazy(loaded) else tuple(loaded.shape)


def read_all(loaded: Any) -> torch.Tensor:
    if not _is_lazy(loaded):
        return loaded
    return loaded[:]
