"""`LoraGraphInputs`: the persistent device buffers a decode CUDA graph's LoRA kernels read.

A graph captured for batch size `bs` launches the LoRA kernels over `max_tiles(bs)` tiles
and reads them, the grouped token rows and the shrink workspace from these buffers; each
replay first copies the step's own `LoraBatch` in and gives the tiles it does not fill a
count of 0, so their programs return at once whatever a previous step left there.
"""

from __future__ import annotations

import torch

from stator.engines.native.lora.batch import LoraBatch, max_tiles


class LoraGraphInputs:
    def __init__(
        self,
        max_batch: int,
        num_slots: int,
        workspace_shape: tuple[int, int],
        device: torch.device,
    ) -> None:
        self.num_slots = num_slots
        self.sorted_idx = torch.zeros(max_batch, dtype=torch.int32, device=device)
        self.tiles = torch.zeros(
            max_tiles(max_batch, num_slots), 3, dtype=torch.int32, device=device
        )
        projections, width = workspace_shape
        self.workspace = torch.zeros(
            projections, max_batch, width, dtype=torch.float32, device=device
        )

    def batch(self, bs: int) -> LoraBatch:
        """The batch a graph of `bs` tokens is captured with (views of the buffers)."""
        return LoraBatch(
            sorted_idx=self.sorted_idx,
            tiles=self.tiles[: max_tiles(bs, self.num_slots)],
            num_tokens=bs,
            workspace=self.workspace[:, :bs] if self.workspace.numel() else None,
        )

    def load(self, step: LoraBatch, bs: int) -> None:
        """Copy a step of at most `bs` tokens in, before replaying the graph of `bs`."""
        self.sorted_idx[: step.sorted_idx.shape[0]].copy_(step.sorted_idx)
        n = step.tiles.shape[0]
        self.tiles[:n].copy_(step.tiles)
        self.tiles[n : max_tiles(bs, self.num_slots)].zero_()
