"""All-reduce and all-gather that a decode CUDA graph can hold, for tensor parallelism on
the GPUs of one host.

ProcessGroupNCCL collectives captured in the decode graphs hung on the device (twice: with
the step sent over NCCL, and with it over gloo; benchmarks/native_gpu_notes.md), so the
graphs use torch's symmetric-memory one-shot all-reduce instead: every rank maps every
other rank's buffer (CUDA IPC), copies its operand into its own buffer, and one kernel
waits for the peers (signal pads) and sums their buffers into the output. No NCCL, no
NVLink multicast (`TORCH_SYMM_MEM_DISABLE_MULTICAST=1`); eager steps keep NCCL.

The all-gather of the LM head's logits is an all-reduce too: each rank writes its block
into a zeroed [size, rows, n] buffer and the sum puts every block in place.

One buffer (and an output of the same size) per rank, sized for the largest operand of a
decode graph; created by every rank in lockstep (its rendezvous is a collective).
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

# The kernel loads 16 bytes at a time: operands are padded to a multiple of this.
_ALIGN_BYTES = 16


class GraphCollectives:
    def __init__(self, numel: int, dtype: torch.dtype, device: torch.device) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        self.group_name = dist.group.WORLD.group_name  # type: ignore[union-attr]
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.align = max(1, _ALIGN_BYTES * 8 // torch.finfo(dtype).bits)  # elements
        numel = -(-numel // self.align) * self.align
        self.buf = symm_mem.empty(numel, dtype=dtype, device=device)
        symm_mem.rendezvous(self.buf, self.group_name)
        self.out = torch.empty(numel, dtype=dtype, device=device)
        # Once outside any graph: the kernel's first launch may set itself up, which a
        # capture would not allow; and a wrong sum fails here, at start.
        probe = torch.ones(self.align, dtype=dtype, device=device)
        if not bool((self.all_reduce(probe) == self.size).all()):
            raise RuntimeError("the symmetric-memory all-reduce summed wrong")
        log.info(
            "graph all-reduce: symmetric memory, %.1f MiB per rank",
            2 * numel * self.buf.element_size() / 2**20,
        )

    def fits(self, x: torch.Tensor) -> bool:
        return x.dtype == self.buf.dtype and x.numel() <= self.buf.numel()

    def _sum_of(self, n: int) -> torch.Tensor:
        """out[:n] = the sum over ranks of buf[:n] (padding included, zeroed here)."""
        m = -(-n // self.align) * self.align
        if m > n:
            self.buf[n:m].zero_()
        torch.ops.symm_mem.one_shot_all_reduce_out(
            self.buf[:m], "sum", self.group_name, self.out[:m]
        )
        return self.out[:n]

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place."""
        n = x.numel()
        self.buf[:n].view_as(x).copy_(x)
        x.copy_(self._sum_of(n).view_as(x))
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """[T, n] on every rank -> [T, size * n], rank r's columns in block r."""
        rows, cols = x.shape
        n = self.size * rows * cols
        blocks = self.buf[:n].view(self.size, rows, cols)
        blocks.zero_()
        blocks[self.rank].copy_(x)
        gathered = self._sum_of(n).view(self.size, rows, cols)
        return gathered.permute(1, 0, 2).reshape(rows, -1)
