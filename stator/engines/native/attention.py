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
    #: Whether `store` writes row t of k and v to slot `slot_mapping[t]` of contiguous
    #: caches and nothing else: then a fused kernel may store them itself (`epilogues.py`).
    stores_by_slot = False

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
        """Attention of q [T, Hq, D] over each sequence's keys (cached ones plus this
        step's k, v [T, Hkv, D], already stored); returns [T, Hq, D] (`out` when given).
        `window`: this layer's sliding window (None: the plan's, 0: none); `sinks` [Hq]:
        one logit per head added to the softmax's denominator (GPT-OSS)."""


@dataclass
class _GatherPlan:
    batch: int
    max_q: int
    max_kv: int
    block_table: torch.Tensor  # [B, ceil(max_kv / block_size)] blocks to gather
    # No padding and no window: plain decode needs no mask, a whole-prompt prefill only
    # SDPA's own causal mask (both take faster paths and skip building a mask).
    unmasked: bool
    causal: bool
    # The general case (ragged lengths, chunked prefill mixed with decode):
    query_index: torch.Tensor | None = None  # [B, max_q] flat token index per padded row
    valid_rows: torch.Tensor | None = None  # flat indices of the real rows in [B * max_q]
    mask: torch.Tensor | None = None  # [B, 1, max_q, max_kv] True where a query may attend
    # The mask as SDPA consumes it (additive, rows repeated per GQA group), made by the
    # first layer and reused by the others.
    sdpa_mask: torch.Tensor | None = None

    def additive_mask(self, group: int, dtype: torch.dtype) -> torch.Tensor:
        assert self.mask is not None
        if self.sdpa_mask is None or self.sdpa_mask.dtype != dtype:
            mask = self.mask if group == 1 else self.mask.repeat(1, 1, group, 1)
            zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
            self.sdpa_mask = zeros.masked_fill_(~mask, float("-inf"))
        return self.sdpa_mask


@dataclass
class _TorchPlans:
    """One gather plan per window the step's layers use, each made by its first layer."""

    ctx: StepContext
    window: int | None  # the default of layers that name none
    plans: dict[int | None, _GatherPlan]


class TorchAttention(AttentionBackend):
    """Gather pages + SDPA. Works on any device; O(B * max_q * max_kv) memory per layer."""

    def plan(self, ctx: StepContext, sliding_window: int | None) -> None:
        ctx.attn_metadata = _TorchPlans(ctx, sliding_window, {})

    @staticmethod
    def _gather_plan(ctx: StepContext, sliding_window: int | None) -> _GatherPlan:
        max_q, max_kv = ctx.max_query_len, ctx.max_seq_len
        window_bites = sliding_window is not None and max_kv > sliding_window
        simple = ctx.uniform and not window_bites
        plan = _GatherPlan(
            batch=ctx.block_tables.shape[0],
            max_q=max_q,
            max_kv=max_kv,
            # Whole blocks are gathered (few large copies, not one index per token).
            block_table=ctx.block_tables[:, : -(-max_kv // ctx.block_size)],
            unmasked=simple and max_q == 1,
            causal=simple and max_q == max_kv and max_q > 1,
        )
        if not (plan.unmasked or plan.causal):
            TorchAttention._plan_general(ctx, plan, sliding_window)
        return plan

    @staticmethod
    def _plan_general(ctx: StepContext, plan: _GatherPlan, sliding_window: int | None) -> None:
        device = ctx.query_lens.device
        q_offsets = torch.arange(plan.max_q, device=device)
        query_valid = q_offsets[None, :] < ctx.query_lens[:, None]
        plan.query_index = torch.where(query_valid, ctx.cu_query_lens[:-1, None] + q_offsets, 0)
        plan.valid_rows = query_valid.flatten().nonzero().squeeze(1)
        key_pos = torch.arange(plan.max_kv, device=device)
        query_pos = (ctx.seq_lens - ctx.query_lens)[:, None] + q_offsets  # [B, max_q]
        mask = key_pos[None, None, :] <= query_pos[:, :, None]
        if sliding_window is not None:
            mask &= key_pos[None, None, :] > query_pos[:, :, None] - sliding_window
        mask &= query_valid[:, :, None]
        # Padding rows attend to key 0 so that softmax never sees an all-masked row (NaN).
        mask[:, :, 0] |= ~query_valid
        plan.mask = mask[:, None]

    def store(
        self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> None:
        slots = get_context().slot_mapping
        keep = slots >= 0
        if not bool(keep.all()):  # padded rows (slot -1) store nothing, as `store_kv`
            slots, k, v = slots[keep], k[keep], v[keep]
        k_cache.view(-1, *k.shape[1:]).index_copy_(0, slots, k)
        v_cache.view(-1, *v.shape[1:]).index_copy_(0, slots, v)

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
        result = self._attend(q, k, v, k_cache, v_cache, scale, window, sinks)
        return result if out is None else out.copy_(result)

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        scale: float,
        window: int | None,
        sinks: torch.Tensor | None,
    ) -> torch.Tensor:
        plans: _TorchPlans = get_context().attn_metadata
        key = plans.window if window is None else (window or None)
        plan = plans.plans.get(key)
        if plan is None:
            plan = plans.plans[key] = self._gather_plan(plans.ctx, key)
        heads_kv, head_dim = k_cache.shape[2], k_cache.shape[3]
        batch, max_q, max_kv = plan.batch, plan.max_q, plan.max_kv
        group = q.shape[1] // heads_kv
        if sinks is not None:
            return _attend_with_sinks(q, k_cache, v_cache, plan, scale, sinks)
        if plan.causal:  # whole prompts, no cached prefix, no padding: this step's k, v
            qb = q.view(batch, max_q, -1, head_dim).transpose(1, 2)
            kb = k.view(batch, max_q, heads_kv, head_dim).transpose(1, 2)
            vb = v.view(batch, max_q, heads_kv, head_dim).transpose(1, 2)
            if group > 1:
                kb, vb = kb.repeat_interleave(group, 1), vb.repeat_interleave(group, 1)
            out = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True, scale=scale)
            return out.transpose(1, 2).reshape(batch * max_q, -1, head_dim)
        # index_select of whole blocks: ~5x faster on the CPU than advanced indexing.
        blocks = plan.block_table.flatten()
        kb = k_cache.index_select(0, blocks).view(batch, -1, heads_kv, head_dim)[:, :max_kv]
        vb = v_cache.index_select(0, blocks).view(batch, -1, heads_kv, head_dim)[:, :max_kv]
        kb, vb = kb.transpose(1, 2), vb.transpose(1, 2)  # [B, Hkv, max_kv, D]
        # GQA without copying keys (SDPA's enable_gqa is ~1000x slower on the CPU): the
        # `group` query heads sharing a KV head become extra rows, [B, Hkv, group*max_q, D].
        if max_q == 1:  # decode only: one query per sequence, already in order
            qb = q.view(batch, heads_kv, group, head_dim)
        else:
            assert plan.query_index is not None
            qb = q[plan.query_index].permute(0, 2, 1, 3)  # [B, Hq, max_q, D]
            qb = qb.reshape(batch, heads_kv, group * max_q, head_dim)
        if plan.unmasked:
            out = F.scaled_dot_product_attention(qb, kb, vb, scale=scale)
        else:
            mask = plan.additive_mask(group, qb.dtype)
            out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, scale=scale)
        if max_q == 1:
            return out.reshape(batch, heads_kv * group, head_dim)
        out = out.reshape(batch, heads_kv * group, max_q, head_dim).transpose(1, 2)
        return out.reshape(batch * max_q, heads_kv * group, head_dim)[plan.valid_rows]


def _attend_with_sinks(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    plan: _GatherPlan,
    scale: float,
    sinks: torch.Tensor,
) -> torch.Tensor:
    """The reference for attention sinks (SDPA has none): softmax over the keys and one
    extra column holding the head's sink logit, which is then dropped."""
    heads_kv, head_dim = k_cache.shape[2], k_cache.shape[3]
    batch, max_q, max_kv = plan.batch, plan.max_q, plan.max_kv
    group = q.shape[1] // heads_kv
    blocks = plan.block_table.flatten()
    kb = k_cache.index_select(0, blocks).view(batch, -1, heads_kv, head_dim)[:, :max_kv]
    vb = v_cache.index_select(0, blocks).view(batch, -1, heads_kv, head_dim)[:, :max_kv]
    kb = kb.transpose(1, 2).repeat_interleave(group, 1)  # [B, Hq, max_kv, D]
    vb = vb.transpose(1, 2).repeat_interleave(group, 1)
    if max_q == 1 and plan.query_index is None:
        qb = q.view(batch, 1, -1, head_dim).transpose(1, 2)  # [B, Hq, 1, D]
    elif plan.query_index is None:  # whole prompts, no padding
        qb = q.view(batch, max_q, -1, head_dim).transpose(1, 2)
    else:
        qb = q[plan.query_index].transpose(1, 2)  # [B, Hq, max_q, D]
    scores = (qb @ kb.transpose(2, 3)).float() * scale
    if plan.mask is not None:
        scores = scores.masked_fill(~plan.mask, float("-inf"))
    elif plan.causal:
        scores = scores.masked_fill(
            torch.ones(max_q, max_kv, dtype=torch.bool, device=q.device).triu(1),
            float("-inf"),
        )
    sink = sinks.float().view(1, -1, 1, 1).expand(batch, -1, scores.shape[2], 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    out = (probs.to(vb.dtype) @ vb).transpose(1, 2)  # [B, max_q, Hq, D]
    if plan.query_index is None:
        return out.reshape(batch * max_q, -1, head_dim)
    return out.reshape(batch * max_q, -1, head_dim)[plan.valid_rows]


def make_backend(name: str, device: torch.device) -> AttentionBackend:
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "torch":
        return TorchAttention()
    if device.type != "cuda":
        raise ValueError("--attention-backend triton needs --device cuda")
    from stator.engines.native.triton_attention import TritonAttention

    return TritonAttention()
