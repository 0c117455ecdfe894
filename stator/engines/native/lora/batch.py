"""Which adapter each token of a step uses, in the layout the LoRA matmuls read.

Tokens are grouped by adapter slot: `sorted_idx` lists the rows of every token that uses
an adapter, slot 0's first, and `starts[s]:starts[s + 1]` is slot s's part of it (tokens of
the base model are in no part). The GPU kernels read those two tensors (fixed shapes, so
a decode CUDA graph replays them); the CPU path takes `groups`, one row index per slot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class LoraBatch:
    sorted_idx: torch.Tensor  # [tokens using an adapter] int32, grouped by slot
    starts: torch.Tensor  # [num_slots + 1] int32
    groups: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (slot, rows)
    num_tokens: int = 0  # tokens of the step (all rows, adapter or not)
    # Zeroed float32 [projections, tokens, width] for every projection's shrink output:
    # one memset per step instead of one per projection (decode-sized steps on CUDA).
    workspace: torch.Tensor | None = None


def token_slots(seq_slots: list[int], num_new: list[int]) -> list[int]:
    out: list[int] = []
    for slot, n in zip(seq_slots, num_new, strict=True):
        out.extend([slot] * n)
    return out


def build_lora_batch(
    slots: list[int], num_slots: int, device: torch.device, *, groups: bool
) -> LoraBatch | None:
    """The batch layout of per-token `slots` (-1 = base model); None when no token uses
    an adapter (the layers then skip LoRA entirely)."""
    per_slot: list[list[int]] = [[] for _ in range(num_slots)]
    for row, slot in enumerate(slots):
        if slot >= 0:
            per_slot[slot].append(row)
    if not any(per_slot):
        return None
    flat: list[int] = []
    starts = [0]
    for rows in per_slot:
        flat.extend(rows)
        starts.append(len(flat))
    batch = LoraBatch(
        sorted_idx=torch.tensor(flat, dtype=torch.int32).to(device, non_blocking=True),
        starts=torch.tensor(starts, dtype=torch.int32).to(device, non_blocking=True),
        num_tokens=len(slots),
    )
    if groups:
        batch.groups = [
            (s, torch.tensor(rows, dtype=torch.long, device=device))
            for s, rows in enumerate(per_slot)
            if rows
        ]
    return batch
