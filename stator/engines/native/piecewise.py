"""Piecewise CUDA graphs for the steps the decode graphs do not take: mixed prefill + decode
steps, chunked prefills, whole prompts (vLLM's PIECEWISE mode, without torch.compile).

The forward pass is cut at each layer's attention, the one part whose kernels depend on the
step's mix of lengths. The rest is captured, per token-count bucket, as L + 1 graphs:

- piece 0: the embedding, layer 0's input norm, q/k/v projection, RoPE and KV store;
- piece i (1 .. L-1): layer i-1's o_proj, post-attention norm (the residual add), MLP, then
  layer i's input norm, q/k/v, RoPE and KV store;
- piece L: layer L-1's o_proj, norm and MLP, and the final norm.

Between two pieces the layer's attention runs eagerly on the step's T real tokens with the
step's own plan (`AttentionBackend.plan`: the decode kernel for its leading one-token
sequences, the extend kernel for the rest), reading q, k, v from and writing its output to
persistent buffers the graphs read and write. A step of T tokens replays the smallest
bucket >= T; its padded rows store nothing (slot -1) and carry whatever ids and positions
an earlier step left, so their finite garbage never reaches a real row: outside attention
every op is row-wise, and attention runs on the first T rows only. No host sync anywhere.

One replay replaces ~10 kernel launches per layer (norms, projections, RoPE, store, MLP),
about 3 of 4 launches of a mixed step. Measured on an H100 (8B shape, bf16): a step of 16,
64 or 240 decodes plus one 128-token prompt took 8.4 / 9.4 / 11.4 ms against 14.3 / 16.2 /
17.5 ms eagerly, the GPU busy 89-95% of it against 37-56%. At the batch cap the eager
launches alone cost the host ~30 ms a step: 240 decodes plus a 600-token prompt took 21.6 ms
as pieces against 35.0 ms eagerly (GPU busy 97% against 61%), and whole ShareGPT-like runs
(mixed steps of ~760 tokens) were 1.06x faster with pieces up to 2,048 tokens. Past ~1,000
tokens a step's matmuls bound it anyway: 240 decodes plus a 1,400 / 1,800-token prompt took
42.0 / 53.1 ms as pieces against 41.9 / 52.4 ms eagerly, the GPU busy 98-99% of it either
way, and whole runs with pieces up to 2,048 tokens (80 buckets: 4.3 s of capture, a 32 MiB
pool and 72 MiB of buffers) were no faster in their 1,025-2,048-token steps (H100,
2026-11-28), hence the default limit of 1,024 tokens (`--piecewise-max-tokens`).

Covered: dense decoders whose class sets `piecewise_graphs` (Llama, Mistral, Qwen2,
Qwen3), one device. Steps with LoRA adapters, prompt embeddings or EAGLE-3's auxiliary
hidden states run eagerly (`eligible`); so do tensor-parallel runners (their collectives
inside a graph need symmetric-memory buffers sized for every bucket: not built).
"""

from __future__ import annotations

import bisect
import logging
import time
from functools import partial

import torch
from torch import nn

from stator.engines.native.context import StepContext, set_context

log = logging.getLogger(__name__)

# (bucket spacing, up to this many tokens). Padded rows cost their share of every matmul,
# which matters where mixed steps are GPU-bound (a 64-token spacing cost ~3% of the heavy
# profile's throughput on an H100): fine up to 1024; coarser past it, where a step's
# matmuls dwarf its launches anyway.
_SPACING = ((16, 1024), (64, 2048), (256, 8192))


def token_buckets(max_tokens: int) -> list[int]:
    """Token counts to capture, ascending, ending at `max_tokens` (padding per step is at
    most one spacing: 16 tokens up to 1024, 64 up to 2048, 256 past it)."""
    if max_tokens < 1:
        return []
    buckets: list[int] = []
    size = 0
    for step, limit in _SPACING:
        while size + step <= min(limit, max_tokens):
            size += step
            buckets.append(size)
    if not buckets or buckets[-1] < max_tokens:
        buckets.append(max_tokens)
    return buckets


def pick_bucket(buckets: list[int], tokens: int) -> int | None:
    """The smallest bucket holding `tokens`; None when none does (the step runs eagerly)."""
    i = bisect.bisect_left(buckets, tokens)
    return buckets[i] if i < len(buckets) else None


def supports(model: nn.Module) -> bool:
    return bool(getattr(model, "piecewise_graphs", False))


def eligible(ctx: StepContext, model: nn.Module) -> bool:
    """Whether a step may replay the pieces: nothing the graphs were not captured with."""
    decoder = model.model
    return ctx.lora is None and ctx.input_embeds is None and not decoder.aux_layers


class PiecewiseGraphs:
    def __init__(self, model: nn.Module, max_tokens: int, device: torch.device) -> None:
        self.model = model
        self.decoder = model.model
        self.layers = list(self.decoder.layers)
        self.buckets = token_buckets(max_tokens)
        attn = self.layers[0].self_attn
        hq, hkv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
        dtype = self.decoder.embed_tokens.weight.dtype
        hidden = self.decoder.embed_tokens.weight.shape[1]

        def buf(*shape: int, fill: int = 0) -> torch.Tensor:
            return torch.full(shape, fill, dtype=torch.long, device=device)

        def act(*shape: int) -> torch.Tensor:
            # Zeroed: padded rows read them before any step has written there.
            return torch.zeros(shape, dtype=dtype, device=device)

        self.input_ids = buf(max_tokens)
        self.positions = buf(max_tokens)
        self.slot_mapping = buf(max_tokens, fill=-1)
        self.residual = act(max_tokens, hidden)
        self.q, self.k, self.v = (
            act(max_tokens, hq, d),
            act(max_tokens, hkv, d),
            act(max_tokens, hkv, d),
        )
        self.attn_out = act(max_tokens, hq, d)
        self.hidden = act(max_tokens, hidden)
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}
        self._device = device
        self.pool_bytes = 0  # what the captured graphs hold besides the buffers above
        self.capture_s = 0.0

    @property
    def max_tokens(self) -> int:
        return self.buckets[-1]

    def _context(self, b: int) -> StepContext:
        """What the pieces read of the step context while captured: the KV store's slots
        (no adapters, no embeddings); the rest is attention's, which runs outside."""
        one = torch.zeros(1, dtype=torch.long, device=self._device)
        return StepContext(
            positions=self.positions[:b],
            slot_mapping=self.slot_mapping[:b],
            block_tables=one[None],
            query_lens=one,
            seq_lens=one,
            cu_query_lens=torch.zeros(2, dtype=torch.long, device=self._device),
            max_query_len=b,
            max_seq_len=b,
            block_size=1,
        )

    def _piece(self, i: int, b: int) -> None:
        residual = self.residual[:b]
        layers = self.layers
        if i == 0:
            residual.copy_(self.decoder.embed_tokens(self.input_ids[:b]))
            h = layers[0].input_layernorm(residual)
        else:
            prev = layers[i - 1]
            y = prev.self_attn.o_proj(self.attn_out[:b].flatten(1))
            x = prev.mlp(prev.post_attention_layernorm(y, residual))
            if i == len(layers):
                self.hidden[:b].copy_(self.decoder.norm(x, residual))
                return
            h = layers[i].input_layernorm(x, residual)
        q, k, v = layers[i].self_attn.project(self.positions[:b], h)
        self.q[:b].copy_(q)
        self.k[:b].copy_(k)
        self.v[:b].copy_(v)

    def buffer_bytes(self) -> int:
        """The persistent step buffers the graphs read and write (their pool is extra)."""
        bufs = (self.input_ids, self.positions, self.slot_mapping, self.residual, self.q)
        bufs += (self.k, self.v, self.attn_out, self.hidden)
        return sum(t.numel() * t.element_size() for t in bufs)

    @torch.inference_mode()
    def capture(self) -> None:
        start = time.perf_counter()
        before = torch.cuda.memory_allocated(self._device)
        # `torch.cuda.graph` runs gc.collect() and empty_cache() before every capture:
        # ~20 ms each, times (L + 1) pieces times ~40 buckets. One side stream, one sync
        # per bucket instead.
        stream = torch.cuda.Stream(self._device)
        pool = None
        for b in reversed(self.buckets):
            set_context(self._context(b))
            try:
                for i in range(len(self.layers) + 1):  # warm-up: compiles, settles allocations
                    self._piece(i, b)
                torch.cuda.synchronize(self._device)
                pieces = []
                with torch.cuda.stream(stream):
                    for i in range(len(self.layers) + 1):
                        graph = torch.cuda.CUDAGraph()
                        graph.capture_begin(*(() if pool is None else (pool,)))
                        try:
                            self._piece(i, b)
                        finally:
                            graph.capture_end()
                        pool = graph.pool()
                        pieces.append(graph)
                torch.cuda.current_stream(self._device).wait_stream(stream)
            finally:
                set_context(None)
            self.graphs[b] = pieces
        torch.cuda.synchronize(self._device)
        self.pool_bytes = torch.cuda.memory_allocated(self._device) - before
        self.capture_s = time.perf_counter() - start
        log.info(
            "captured piecewise CUDA graphs (%d pieces) for %d token buckets up to %d in %.1f s "
            "(graph pool %.0f MiB, step buffers %.0f MiB)",
            len(self.layers) + 1,
            len(self.buckets),
            self.max_tokens,
            self.capture_s,
            self.pool_bytes / 2**20,
            self.buffer_bytes() / 2**20,
        )

    @torch.inference_mode()
    def run(
        self, input_ids: torch.Tensor, ctx: StepContext, *, replay: bool = True
    ) -> torch.Tensor:
        """Final hidden states [T, hidden] of a step of T <= max_tokens tokens; the caller
        has planned attention for `ctx` and set it as the step context. `replay=False`
        runs the pieces eagerly instead (the same split, on any device: tests)."""
        t = input_ids.shape[0]
        b = pick_bucket(self.buckets, t)
        assert b is not None, f"{t} tokens: more than the largest bucket {self.max_tokens}"
        self.input_ids[:t].copy_(input_ids)
        self.positions[:t].copy_(ctx.positions)
        self.slot_mapping[:t].copy_(ctx.slot_mapping)
        self.slot_mapping[t:b].fill_(-1)
        q, k, v, out = self.q[:t], self.k[:t], self.v[:t], self.attn_out[:t]
        if replay:
            pieces = [graph.replay for graph in self.graphs[b]]
        else:
            pieces = [partial(self._eager_piece, i, b, ctx) for i in range(len(self.layers) + 1)]
        for layer, piece in zip(self.layers, pieces, strict=False):
            piece()
            layer.self_attn.attend(q, k, v, out=out)
        pieces[-1]()
        return self.hidden[:t]

    def _eager_piece(self, i: int, b: int, step: StepContext) -> None:
        """Piece i run eagerly, under the context its graph is captured with."""
        set_context(self._context(b))
        try:
            self._piece(i, b)
        finally:
            set_context(step)
