"""The CUDA attention backend: the Triton kernels behind the `AttentionBackend` interface.

A step whose every sequence computes one token runs the split-K decode kernel; any other
step (prefill, chunked prefill, mixed prefill + decode, prefix-cache hits) the extend
kernel. Both read keys only from the paged cache, which `store` fills first.
`num_splits` is fixed by the plan from the batch size alone when the step is captured in a
CUDA graph (`ctx.max_seq_len` is then the model's context length), so graphs stay valid.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from stator.engines.native.attention import AttentionBackend
from stator.engines.native.context import StepContext, get_context
from stator.engines.native.kernels.decode_attention import (
    default_num_splits,
    paged_decode_attention,
)
from stator.engines.native.kernels.extend_attention import paged_extend_attention
from stator.engines.native.kernels.store_kv import store_kv


@dataclass
class _TritonPlan:
    decode: bool
    window: int
    # Mixed steps: the leading one-token sequences, run by the decode kernel (the extend
    # kernel would spend a 16-64-row query tile and a full key walk per q head on each).
    num_decode: int
    num_splits: int = 0  # resolved on the first layer (needs Hkv)


class TritonAttention(AttentionBackend):
    stores_by_slot = True

    def plan(self, ctx: StepContext, sliding_window: int | None) -> None:
        decode = ctx.max_query_len == 1
        ctx.attn_metadata = _TritonPlan(
            decode=decode,
            window=sliding_window or 0,
            num_decode=ctx.block_tables.shape[0] if decode else ctx.num_leading_single,
        )

    def store(
        self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> None:
        store_kv(k, v, k_cache, v_cache, get_context().slot_mapping)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        scale: float,
        *,
        window: int | None = None,
        sinks: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        ctx = get_context()
        plan: _TritonPlan = ctx.attn_metadata
        window = plan.window if window is None else window
        nd = plan.num_decode
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        if nd > 0:
            if plan.num_splits == 0:
                plan.num_splits = default_num_splits(nd, k_cache.shape[2], ctx.max_seq_len)
            # Decode sequences come first, so their query rows are rows 0..nd-1.
            paged_decode_attention(
                q[:nd],
                k_cache,
                v_cache,
                ctx.block_tables[:nd],
                ctx.seq_lens[:nd],
                scale,
                num_splits=plan.num_splits,
                window=window,
                sinks=sinks,
                out=out[:nd],
            )
        if plan.decode:
            return out
        # The rest: cu_query_lens holds absolute row offsets, so slices suffice.
        return paged_extend_attention(
            q,
            k_cache,
            v_cache,
            ctx.block_tables[nd:],
            ctx.cu_query_lens[nd:],
            ctx.seq_lens[nd:],
            ctx.max_query_len,
            scale,
            window=window,
            sinks=sinks,
            out=out,
        )
