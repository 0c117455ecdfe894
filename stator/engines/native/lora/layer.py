"""`LoraLayer`: the adapter slots of one projection, applied around its base matmul.

A projection of `n` shards (q/k/v: 3, gate/up: 2, others: 1) holds, per slot,
`a` [n * R, in] (shard i's A in rows i*R..) and `b` [out, R] (each output row's B row, of
its own shard); ranks below R are zero-padded. `y += (x @ A_i^T) @ B_i^T` per shard, for
the tokens of each slot: Triton kernels on CUDA, a loop over the slots in use elsewhere.

The projection calls `shrink(x)` before its base matmul and `expand(y)` after it. While a
CUDA graph is captured the shrink goes on a side stream, so the graph runs it beside the
base matmul (both only read x) and the step waits for the small kernel's latency once
per projection (the expand) instead of twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stator.engines.native.lora.batch import LoraBatch


@dataclass
class PendingLora:
    x: torch.Tensor
    h: torch.Tensor | None = None  # the shrink's output (CUDA)
    side: torch.cuda.Stream | None = None  # the stream the shrink was queued on


class LoraLayer:
    # Queue the shrink on a side stream while a CUDA graph is captured (module doc).
    overlap_shrink = True
    _side_streams: dict[torch.device, torch.cuda.Stream] = {}

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
        pending = PendingLora(x)
        if not x.is_cuda:
            return pending  # the torch path does both halves in `expand`
        from stator.engines.native.kernels.lora import lora_shrink

        # Made outside a capture (the warm-up step before it): creating streams is no
        # operation a graph can record.
        side = self._side_streams.get(x.device)
        if side is None:
            side = self._side_streams[x.device] = torch.cuda.Stream(x.device)
        if self.overlap_shrink and torch.cuda.is_current_stream_capturing():
            side.wait_stream(torch.cuda.current_stream(x.device))
            with torch.cuda.stream(side):
                pending.h = lora_shrink(x, self.a, batch, self.index)
            pending.side = side
        else:
            pending.h = lora_shrink(x, self.a, batch, self.index)
        return pending

    def expand(self, pending: PendingLora, y: torch.Tensor, batch: LoraBatch) -> torch.Tensor:
        if pending.h is None:
            return self._apply_torch(pending.x, y, batch)
        from stator.engines.native.kernels.lora import lora_expand

        if pending.side is not None:
            torch.cuda.current_stream(y.device).wait_stream(pending.side)
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
