"""Which adapter each token of a step uses, in the layout the LoRA matmuls read.

Tokens are grouped by adapter slot: `sorted_idx` lists the rows of every token that uses
an adapter, slot 0's first; `tiles` cuts each slot's part of it into tiles of at most
`TILE_M` tokens, one row `(slot, start in sorted_idx, count)` per tile. The GPU kernels
run one program per tile (and column block), so no program looks at a slot the step does
not use; tokens of the base model are in no tile. The CPU path takes `groups`, one row
index per slot.

A decode CUDA graph launches a fixed grid, so it is captured for the most tiles a step
of its batch size can have (`max_tiles`); the rows past a step's own tiles have count 0
and their programs return at once (`lora.graph_inputs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from stator.engines.native.overlap import to_device

# Tokens per tile: the smallest M of a tensor-core dot in Triton. Decode steps give each
# adapter a few tokens, so a larger tile would mostly multiply padding; a long prefill
# re-reads its adapter's weights once per 16 tokens, from L2 (a few % of its base matmul).
TILE_M = 16
# Steps of at most this many tokens zero one workspace for all projections at once;
# larger ones (prefill) zero each projection's own, which keeps it small.
SHARED_SCRATCH = 512


@dataclass
class LoraBatch:
    sorted_idx: torch.Tensor  # [tokens using an adapter] int32, grouped by slot
    tiles: torch.Tensor  # [tiles, 3] int32: (slot, start in sorted_idx, count <= TILE_M)
    groups: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (slot, rows)
    num_tokens: int = 0  # tokens of the step (all rows, adapter or not)
    # (projections, widest shrink output) of the model's LoRA layers: the shape of the
    # step's workspace, made on first use (`scratch`), so a step that replays a CUDA
    # graph (which has its own) allocates and zeroes none.
    scratch_shape: tuple[int, int] | None = None
    # Zeroed float32 [projections, tokens, width] for every projection's shrink output:
    # one memset per step instead of one per projection.
    workspace: torch.Tensor | None = None

    def scratch(self, index: int, width: int, device: torch.device) -> torch.Tensor:
        """Projection `index`'s zeroed shrink output [tokens, width]."""
        if self.workspace is None and self.scratch_shape and self.num_tokens <= SHARED_SCRATCH:
            projections, widest = self.scratch_shape
            self.workspace = torch.zeros(
                projections, self.num_tokens, widest, dtype=torch.float32, device=device
            )
        if self.workspace is not None:
            return self.workspace[index, :, :width]
        return torch.zeros(self.num_tokens, width, dtype=torch.float32, device=device)


def max_tiles(num_tokens: int, num_slots: int) -> int:
    """The most tiles `num_tokens` tokens over `num_slots` slots can make: k slots in use
    make k + (tokens - k) // TILE_M at most, which grows with k."""
    k = min(num_slots, num_tokens)
    return k + (num_tokens - k) // TILE_M


def token_slots(seq_slots: list[int], num_new: list[int]) -> list[int]:
    out: list[int] = []
    for slot, n in zip(seq_slots, num_new, strict=True):
        out.extend([slot] * n)
    return out


def build_lora_batch(
    slots: list[int],
    num_slots: int,
    device: torch.device,
    *,
    groups: bool,
    scratch_shape: tuple[int, int] | None = None,
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
    tiles: list[int] = []
    for slot, rows in enumerate(per_slot):
        for offset in range(0, len(rows), TILE_M):
            tiles.extend((slot, len(flat) + offset, min(TILE_M, len(rows) - offset)))
        flat.extend(rows)
    # One host-to-device copy for both, through pinned memory (`to_device`).
    packed = to_device(tiles + flat, device, dtype=torch.int32)
    batch = LoraBatch(
        sorted_idx=packed[len(tiles) :],
        tiles=packed[: len(tiles)].view(-1, 3),
        num_tokens=len(slots),
        scratch_shape=scratch_shape,
    )
    if groups:
        batch.groups = [
            (s, torch.tensor(rows, dtype=torch.long, device=device))
            for s, rows in enumerate(per_slot)
            if rows
        ]
    return batch
