"""CUDA graphs for decode steps: one graph per batch-size bucket, all reading persistent
input buffers, sharing one memory pool (captured largest first).

A decode step of n sequences replays the smallest bucket >= n: the step's inputs are copied
into the first n rows of the buffers; the padded rows get slot -1 (the KV store skips them)
and length 0 (attention writes zeros for them). The graph covers the whole forward pass and
the LM head, so one replay replaces ~10 kernel launches per layer.

With `tokens_per_seq` q > 1 the same graphs serve speculative decoding's verification:
every sequence computes its last real token and q - 1 drafts, with a logits row for each
(the extend attention kernel; its grid depends only on the bucket and q).
"""

from __future__ import annotations

import bisect
import logging

import torch
from torch import nn

from stator.engines.native.attention import AttentionBackend
from stator.engines.native.context import StepContext, set_context
from stator.engines.native.lora.graph_inputs import LoraGraphInputs

log = logging.getLogger(__name__)


def batch_buckets(max_batch: int) -> list[int]:
    small = [b for b in (1, 2, 4, 8) if b < max_batch]
    return small + list(range(16, max_batch, 16)) + [max_batch]


class DecodeGraphs:
    def __init__(
        self,
        model: nn.Module,
        backend: AttentionBackend,
        *,
        max_batch: int,
        max_blocks_per_seq: int,
        max_model_len: int,
        block_size: int,
        sliding_window: int | None,
        device: torch.device,
        lora_slots: int = 0,
        lora_workspace: tuple[int, int] | None = None,
        tokens_per_seq: int = 1,
    ) -> None:
        self.model = model
        self.backend = backend
        self.buckets = batch_buckets(max_batch)
        self.tokens_per_seq = q = tokens_per_seq
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.sliding_window = sliding_window

        def buf(*shape: int, fill: int = 0) -> torch.Tensor:
            return torch.full(shape, fill, dtype=torch.long, device=device)

        self.input_ids = buf(max_batch * q)
        self.positions = buf(max_batch * q)
        self.slot_mapping = buf(max_batch * q, fill=-1)
        self.block_tables = buf(max_batch, max_blocks_per_seq)
        self.seq_lens = buf(max_batch)
        self.query_lens = buf(max_batch, fill=q)
        self.cu_query_lens = q * torch.arange(max_batch + 1, dtype=torch.long, device=device)
        # With LoRA, each bucket has a second graph that runs the adapter kernels, reading
        # the step's tiles of tokens per adapter from these buffers (`lora.graph_inputs`).
        self.lora_variants = (False, True) if lora_slots else (False,)
        if lora_slots and q > 1:
            raise ValueError("LoRA graphs are decode graphs: one token per sequence")
        self.lora_inputs = (
            LoraGraphInputs(max_batch, lora_slots, lora_workspace or (0, 0), device)
            if lora_slots
            else None
        )
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self.logits: dict[tuple[int, bool], torch.Tensor] = {}

    def _context(self, bs: int, with_lora: bool) -> StepContext:
        tokens = bs * self.tokens_per_seq
        lora = self.lora_inputs.batch(bs) if with_lora and self.lora_inputs else None
        return StepContext(
            positions=self.positions[:tokens],
            slot_mapping=self.slot_mapping[:tokens],
            block_tables=self.block_tables[:bs],
            query_lens=self.query_lens[:bs],
            seq_lens=self.seq_lens[:bs],
            cu_query_lens=self.cu_query_lens[: bs + 1],
            max_query_len=self.tokens_per_seq,
            # Kernel launch constants must not depend on the step: plan for the longest.
            max_seq_len=self.max_model_len,
            block_size=self.block_size,
            lora=lora,
        )

    def _forward(self, bs: int, with_lora: bool) -> torch.Tensor:
        ctx = self._context(bs, with_lora)
        if ctx.lora is not None and ctx.lora.workspace is not None:
            ctx.lora.workspace.zero_()  # part of the graph: one memset per replay
        self.backend.plan(ctx, self.sliding_window)
        set_context(ctx)
        try:
            hidden = self.model(self.input_ids[: bs * self.tokens_per_seq], ctx.positions)
            return self.model.compute_logits(hidden)
        finally:
            set_context(None)

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        for bs in reversed(self.buckets):
            for with_lora in self.lora_variants:
                self._forward(bs, with_lora)  # warm-up: compiles kernels, settles allocations
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.logits[bs, with_lora] = self._forward(bs, with_lora)
                pool = graph.pool()
                self.graphs[bs, with_lora] = graph
        torch.cuda.synchronize()
        what = "decode" if self.tokens_per_seq == 1 else f"{self.tokens_per_seq}-token verify"
        log.info("captured %s CUDA graphs for batch sizes %s", what, self.buckets)

    def fits(self, batch: int, blocks_per_seq: int) -> bool:
        return batch <= self.buckets[-1] and blocks_per_seq <= self.block_tables.shape[1]

    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """Logits [n * q, vocab] of a step of n sequences computing q tokens each."""
        n = ctx.block_tables.shape[0]
        bs = self.buckets[bisect.bisect_left(self.buckets, n)]
        t, q = input_ids.shape[0], self.tokens_per_seq
        self.input_ids[:t].copy_(input_ids)
        self.positions[:t].copy_(ctx.positions)
        self.slot_mapping[:t].copy_(ctx.slot_mapping)
        self.slot_mapping[t : bs * q].fill_(-1)
        self.seq_lens[:n].copy_(ctx.seq_lens)
        self.seq_lens[n:bs].fill_(0)
        width = ctx.block_tables.shape[1]
        self.block_tables[:n, :width].copy_(ctx.block_tables)
        lora = ctx.lora
        if lora is not None and self.lora_inputs is not None:
            self.lora_inputs.load(lora, bs)
        key = (bs, lora is not None)
        self.graphs[key].replay()
        return self.logits[key][:t]
