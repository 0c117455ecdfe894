"""Whole KV blocks in and out of the paged pool, in few large copies.

The native engine's KV cache is one tensor, the *pool*:

    [num_layers, 2 (keys, values), num_blocks, block_size, num_kv_heads, head_dim]

Each layer's key and value caches are contiguous views of it (`pool[layer, 0]`,
`pool[layer, 1]`), which is what the attention kernels read. One block's data is then
2 * num_layers slices of block_size * num_kv_heads * head_dim elements each (32 KiB for an
8B model in bf16). Copying a block slice by slice costs 2 * num_layers small copies per
block; on an H100 that reached only 28-29% of the host-to-device bandwidth. So:

- `gather` packs any set of blocks into a block-major tensor [n, num_layers, 2, block_size,
  num_kv_heads, head_dim] with one indexing kernel on the pool's device;
- `scatter` unpacks such a tensor into any set of blocks with one kernel;
- what crosses the bus is then one contiguous copy per run of adjacent slots on the other
  side (`runs`), not one per block and layer.

`BlockMover` does the crossing: device -> host copies (`save`) and host -> device copies
(`load`) on a stream of their own, so a step's kernels never wait for the bus; the events
it returns say when a copy is done. On the CPU build the same calls are plain copies.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def pool_shape(
    num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
) -> tuple[int, ...]:
    return (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)


def block_shape(pool: torch.Tensor) -> tuple[int, ...]:
    """The shape of one block's data, block-major: [num_layers, 2, block_size, heads, dim]."""
    layers, two, _, *rest = pool.shape
    return (layers, two, *rest)


def block_bytes(pool: torch.Tensor) -> int:
    n = 1
    for d in block_shape(pool):
        n *= d
    return n * pool.element_size()


def _ids(ids: Sequence[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    if isinstance(ids, torch.Tensor):
        return ids.to(device=device, dtype=torch.long, non_blocking=True)
    return torch.tensor(list(ids), dtype=torch.long).to(device, non_blocking=True)


def gather(pool: torch.Tensor, block_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """The blocks' data, block-major and contiguous: [n, num_layers, 2, block_size, ...]."""
    return pool.movedim(2, 0)[_ids(block_ids, pool.device)]


def scatter(
    pool: torch.Tensor, block_ids: Sequence[int] | torch.Tensor, data: torch.Tensor
) -> None:
    """Write block-major `data` [n, num_layers, 2, ...] into the pool's blocks `block_ids`."""
    pool.movedim(2, 0).index_copy_(0, _ids(block_ids, pool.device), data.to(pool.device))


def runs(slots: Sequence[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of consecutive slots, as (index into `slots`, first slot, length)."""
    out: list[tuple[int, int, int]] = []
    start = 0
    for i in range(1, len(slots) + 1):
        if i == len(slots) or slots[i] != slots[i - 1] + 1:
            out.append((start, slots[start], i - start))
            start = i
    return out


class BlockMover:
    """Copies between a device pool and a block-major host buffer [slots, *block_shape].

    `save` reads the pool in stream order (so later writes to those blocks are safe to
    enqueue at once) and writes the host buffer on the copy stream; `load` waits on the
    copy stream for everything enqueued on the current stream so far (earlier reads of the
    target blocks, earlier saves of what they held), then copies and scatters. Both return
    an event (None on the CPU, where they are synchronous) that the caller waits on before
    reading what was written."""

    def __init__(self, pool: torch.Tensor) -> None:
        self.pool = pool
        self.device = pool.device
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def save(
        self, block_ids: Sequence[int], host: torch.Tensor, slots: Sequence[int]
    ) -> torch.cuda.Event | None:
        if not block_ids:
            return None
        staged = gather(self.pool, block_ids)
        if self.stream is None:
            _copy_runs(host, slots, staged, to_host=True)
            return None
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            _copy_runs(host, slots, staged, to_host=True)
            # The staging memory belongs to the current stream's allocator pool: keep it
            # from being reused until the copy stream has read it.
            staged.record_stream(self.stream)
            return self.stream.record_event(torch.cuda.Event(enable_timing=True))

    def load(
        self,
        host: torch.Tensor,
        slots: Sequence[int],
        block_ids: Sequence[int],
        start: torch.cuda.Event | None = None,
    ) -> torch.cuda.Event | None:
        """`start`, when given, is recorded on the copy stream once its wait is over (to
        time the copy itself with `start.elapsed_time(done)`)."""
        if not block_ids:
            return None
        if self.stream is None:
            scatter(self.pool, block_ids, _host_rows(host, slots))
            return None
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            if start is not None:
                start.record(self.stream)
            staged = torch.empty(
                (len(slots), *host.shape[1:]), dtype=host.dtype, device=self.device
            )
            _copy_runs(host, slots, staged, to_host=False)
            scatter(self.pool, block_ids, staged)
            return self.stream.record_event(torch.cuda.Event(enable_timing=True))

    def wait(self, event: torch.cuda.Event | None) -> None:
        """Make the current stream wait for `event` (no host wait)."""
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)


def _host_rows(host: torch.Tensor, slots: Sequence[int]) -> torch.Tensor:
    parts = [host[s : s + n] for _, s, n in runs(slots)]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _copy_runs(host: torch.Tensor, slots: Sequence[int], staged: torch.Tensor, to_host: bool):
    for i, s, n in runs(slots):
        if to_host:
            host[s : s + n].copy_(staged[i : i + n], non_blocking=True)
        else:
            staged[i : i + n].copy_(host[s : s + n], non_blocking=True)
