"""Paged attention behind one interface; the PyTorch reference implementation lives here.

A backend stores the step's new keys and values into the paged cache and attends each
query over its sequence's pages. `TorchAttention` gathers every sequence's pages into a
padded batch and calls SDPA with a causal (bottom-right aligned) mask: simple, exact, used
on the CPU and as the reference in tests. GPU kernels implement the same three methods.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from stator.engines.native.context import StepContext, get_context


class AttentionBackend(abc.ABC):
    @abc.abstractmethod
    def plan(self, ctx: StepContext, sliding_window: int | None) -> None:
        """Precompute per-step metadata into `ctx.attn_metadata` (once, for all layers)."""

    @abc.abstractmethod
    def store(
        self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> None:
        """Write k, v [T, Hkv, D] into the caches [num_blocks, block_size, Hkv, D]."""

    @abc.abstractmethod
    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """Attention of q [T, Hq, D] over each sequence's cached keys; returns [T, Hq, D]."""


@dataclass
class _GatherPlan:
    query_index: torch.Tensor  # [B, max_q] flat token index per padded query row
    query_valid: torch.Tensor  # [B, max_q] real (not padding) query rows
    kv_slots: torch.Tensor  # [B, max_kv] cache slot of each key position
    mask: torch.Tensor  # [B, 1, max_q, max_kv] True where a query may attend a key


class TorchAttention(AttentionBackend):
    """Gather pages + SDPA. Works on any device; O(B * max_q * max_kv) memory per layer."""

    def plan(self, ctx: StepContext, sliding_window: int | None) -> None:
        device = ctx.query_lens.device
        max_q, max_kv = ctx.max_query_len, ctx.max_seq_len
        q_offsets = torch.arange(max_q, device=device)
        query_valid = q_offsets[None, :] < ctx.query_lens[:, None]
        query_index = torch.where(query_valid, ctx.cu_query_lens[:-1, None] + q_offsets, 0)
        in_block = torch.arange(ctx.block_size, device=device)
        slots = (ctx.block_tables[:, :, None] * ctx.block_size + in_block).flatten(1)
        kv_slots = slots[:, :max_kv]
        key_pos = torch.arange(max_kv, device=device)
        query_pos = (ctx.seq_lens - ctx.query_lens)[:, None] + q_offsets  # [B, max_q]
        mask = key_pos[None, None, :] <= query_pos[:, :, None]
        if sliding_window is not None:
            mask &= key_pos[None, None, :] > query_pos[:, :, None] - sliding_window
        mask &= query_valid[:, :, None]
        # Padding rows attend to key 0 so that softmax never sees an all-masked row (NaN).
        mask[:, :, 0] |= ~query_valid
        ctx.attn_metadata = _GatherPlan(query_index, query_valid, kv_slots, mask[:, None])

    def store(
        self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> None:
        slots = get_context().slot_mapping
        k_cache.view(-1, *k.shape[1:]).index_copy_(0, slots, k)
        v_cache.view(-1, *v.shape[1:]).index_copy_(0, slots, v)

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float
    ) -> torch.Tensor:
        plan: _GatherPlan = get_context().attn_metadata
        heads_kv, head_dim = k_cache.shape[2], k_cache.shape[3]
        qb = q[plan.query_index].transpose(1, 2)  # [B, Hq, max_q, D]
        kb = k_cache.view(-1, heads_kv, head_dim)[plan.kv_slots].transpose(1, 2)
        vb = v_cache.view(-1, heads_kv, head_dim)[plan.kv_slots].transpose(1, 2)
        group = qb.shape[1] // heads_kv
        if group > 1:
            # Explicit head repeat: SDPA's enable_gqa takes a slow path on the CPU (~1000x).
            kb = kb.repeat_interleave(group, dim=1)
            vb = vb.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=plan.mask, scale=scale)
        return out.transpose(1, 2)[plan.query_valid]
