"""Rank 0 hands each step's inputs to the other tensor-parallel ranks.

One broadcast per step over the host (gloo) group: a fixed-size message holding a header
of sizes and flags and, when it fits (`INLINE` int64s: every decode step up to a few dozen
sequences of a few hundred tokens), the packed payload (token ids, positions, slots, block
tables, lengths, logits rows). A larger payload follows in a second broadcast, sized by
the header. Each rank copies the payload to its device, rebuilds the same `StepInputs` and
runs the same forward. The step is on the critical path of every decode step (rank 1
launches only once it has it): one message instead of two saves a loopback round of gloo.

The payload goes over gloo, not NCCL: the one run on two H200s with an NCCL broadcast here
(and NCCL collectives captured in decode graphs) hung after start-up, while gloo ran
(see benchmarks/native_gpu_notes.md). It costs rank 0 a copy of a few KiB to the host per
step, which waits for the step before (its sampled tokens are this step's input ids).
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


# int64s of payload carried in the header's message (8 KiB): a decode step of B sequences
# with W-block tables needs 5B + 1 + B*W of them.
INLINE = 1024


class StepChannel:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.message = torch.empty(_HEADER + INLINE, dtype=torch.long)

    def send(self, inputs: StepInputs) -> None:
        ctx = inputs.ctx
        batch, width = ctx.block_tables.shape
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
        message = self.message
        message[:_HEADER] = torch.tensor(header, dtype=torch.long)
        inline = payload.numel() <= INLINE
        if inline:
            message[_HEADER : _HEADER + payload.numel()] = payload
        dist.broadcast(message, 0, group=parallel.host_group())
        if not inline:
            dist.broadcast(payload, 0, group=parallel.host_group())

    def send_stop(self) -> None:
        self.message.zero_()
        self.message[0] = _STOP
        dist.broadcast(self.message, 0, group=parallel.host_group())

    def recv(self) -> StepInputs | None:
        """The next step's inputs, or None when rank 0 stops the group."""
        message = self.message
        dist.broadcast(message, 0, group=parallel.host_group())
        op, tokens, batch, width, rows, max_q, max_kv, block, uniform, single, plain = message[
            :_HEADER
        ].tolist()
        if op == _STOP:
            return None
        sizes = [tokens, tokens, tokens, batch * width, batch, batch, batch + 1, rows]
        total = sum(sizes)
        if total <= INLINE:
            received = message[_HEADER : _HEADER + total]
        else:
            received = torch.empty(total, dtype=torch.long)
            dist.broadcast(received, 0, group=parallel.host_group())
        # A copy, also on the CPU: the message buffer is reused by the next step.
        payload = received.to(self.device, copy=True)
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
