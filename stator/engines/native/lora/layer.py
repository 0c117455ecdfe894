"""`LoraLayer`: the adapter slots of one projection, applied around its base matmul
(`shrink` before it, `expand` after it).

A projection of `n` shards (q/k/v: 3, gate/up: 2, others: 1) holds, per slot,
`a` [n * R, in] (shard i's A in rows i*R..) and `b` [out, R] (each output row's B row, of
its own shard); ranks below R are zero-padded. `y += (x @ A_i^T) @ B_i^T` per shard, for
the tokens of each slot: Triton kernels on CUDA, a loop over the slots in use elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stator.engines.native.lora.batch import LoraBatch


@dataclass
class PendingLora:
    x: torch.Tensor
    h: torch.Tensor | None = None  # the shrink's output (CUDA)


class LoraLayer:
    def __init__(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        bounds: list[tuple[int, int]],
        rank: int,
        index: int = 0,
    ) -> None:
        self.index = index  # this projection's row of `LoraBatch.workspace`
        self.a = a
        self.b = b
        self.bounds = bounds
        self.rank = rank

    def shrink(self, x: torch.Tensor, batch: LoraBatch) -> PendingLora:
        """The first half, before the base matmul (CUDA: h = x @ A^T into the workspace)."""
        if not x.is_cuda:
            return PendingLora(x)  # the torch path does both halves in `expand`
        from stator.engines.native.kernels.lora import lora_shrink

        return PendingLora(x, lora_shrink(x, self.a, batch, self.index))

    def expand(self, pending: PendingLora, y: torch.Tensor, batch: LoraBatch) -> torch.Tensor:
        """y (the base matmul's output) += the delta, in place on CUDA."""
        if pending.h is None:
            return self._apply_torch(pending.x, y, batch)
        from stator.engines.native.kernels.lora import lora_expand

        lora_expand(pending.h, self.b, y, batch, self.bounds, self.rank)
        return y

    def _apply_torch(self, x: torch.Tensor, y: torch.Tensor, batch: LoraBatch) -> torch.Tensor:
        r = self.rank
        whole = x.shape[0]
        for slot, rows in batch.groups:
            xs = x if rows.numel() == whole else x.index_select(0, rows)
            h = xs @ self.a[slot].t()
            if len(self.bounds) == 1:
                delta = h @ self.b[slot].t()
            else:
                delta = torch.empty(xs.shape[0], y.shape[1], dtype=y.dtype, device=y.device)
                for i, (start, stop) in enumerate(self.bounds):
                    delta[:, start:stop] = h[:, i * r : (i + 1) * r] @ self.b[slot, start:stop].t()
            y = y.add_(delta) if rows.numel() == whole else y.index_add_(0, rows, delta)
        return y
