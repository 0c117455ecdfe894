"""Rank 0 hands each step's inputs to the other tensor-parallel ranks.

Two broadcasts per step over the host (gloo) group: a fixed-size header of sizes and
flags, which the receivers need to shape their buffers, then one packed int64 tensor
(token ids, positions, slots, block tables, lengths, logits rows) that each rank copies
to its device. Every rank then rebuilds the same `StepInputs` and runs the same forward.

The payload goes over gloo, not NCCL, because the one run on two H200s with an NCCL
broadcast here (and decode CUDA graphs) hung after start-up, while gloo collectives and
eager NCCL all-reduces ran there (see benchmarks/native_gpu_notes.md). It costs rank 0 a
copy of a few KiB to the host per step.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from stator.engines.native import parallel
from stator.engines.native.context import StepContext
from stator.engines.native.model_runner import StepInputs

_STEP, _STOP = 1, 2
# op, tokens, batch, table width, logits rows, max_query_len, max_seq_len, block_size,
# uniform, num_leading_single, plain_decode
_HEADER = 11


class StepChannel:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def send(self, inputs: StepInputs) -> None:
        ctx = inputs.ctx
        batch, width = ctx.block_tables.shape
        header = [
            _STEP,
            inputs.input_ids.shape[0],
            batch,
            width,
            inputs.logits_rows.shape[0],
            ctx.max_query_len,
            ctx.max_seq_len,
            ctx.block_size,
            int(ctx.uniform),
            ctx.num_leading_single,
            int(inputs.plain_decode),
        ]
        dist.broadcast(torch.tensor(header, dtype=torch.long), 0, group=parallel.host_group())
        parts = (
            inputs.input_ids,
            ctx.positions,
            ctx.slot_mapping,
            ctx.block_tables.flatten(),
            ctx.query_lens,
            ctx.seq_lens,
            ctx.cu_query_lens,
            inputs.logits_rows,
        )
        payload = torch.cat([p.to(torch.long) for p in parts]).cpu()
        dist.broadcast(payload, 0, group=parallel.host_group())

    def send_stop(self) -> None:
        header = torch.zeros(_HEADER, dtype=torch.long)
        header[0] = _STOP
        dist.broadcast(header, 0, group=parallel.host_group())

    def recv(self) -> StepInputs | None:
        """The next step's inputs, or None when rank 0 stops the group."""
        header = torch.empty(_HEADER, dtype=torch.long)
        dist.broadcast(header, 0, group=parallel.host_group())
        op, tokens, batch, width, rows, max_q, max_kv, block, uniform, single, plain = (
            header.tolist()
        )
        if op == _STOP:
            return None
        sizes = [tokens, tokens, tokens, batch * width, batch, batch, batch + 1, rows]
        received = torch.empty(sum(sizes), dtype=torch.long)
        dist.broadcast(received, 0, group=parallel.host_group())
        payload = received.to(self.device, non_blocking=True)
        ids, pos, slots, tables, q_lens, kv_lens, cu, logits_rows = payload.split(sizes)
        ctx = StepContext(
            positions=pos,
            slot_mapping=slots,
            block_tables=tables.view(batch, width),
            query_lens=q_lens,
            seq_lens=kv_lens,
            cu_query_lens=cu,
            max_query_len=max_q,
            max_seq_len=max_kv,
            block_size=block,
            uniform=bool(uniform),
            num_leading_single=single,
        )
        return StepInputs(input_ids=ids, ctx=ctx, logits_rows=logits_rows, plain_decode=bool(plain))
