"""The per-step context: what the attention layers need to know about the batch.

The model runner sets it before the forward pass and clears it after, so layers take only
hidden states as arguments (the batch layout is not threaded through every signature).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class StepContext:
    """One engine step's flattened batch: B sequences, T = sum of query lengths tokens."""

    positions: torch.Tensor  # [T] position of each scheduled token
    slot_mapping: torch.Tensor  # [T] KV slot (block_id * block_size + offset) it writes
    block_tables: torch.Tensor  # [B, max_blocks] block ids, padded with 0
    query_lens: torch.Tensor  # [B] tokens computed this step per sequence
    seq_lens: torch.Tensor  # [B] KV length per sequence after this step
    cu_query_lens: torch.Tensor  # [B + 1] prefix sums of query_lens
    max_query_len: int
    max_seq_len: int
    block_size: int
    # Every sequence has the same query and KV length (lets attention skip its mask).
    uniform: bool = False
    # How many sequences at the front of the batch compute exactly one token (the decodes
    # the scheduler puts first): a mixed step runs them through the decode kernel.
    num_leading_single: int = 0
    # Whatever the attention backend precomputes once per step (see AttentionBackend.plan).
    attn_metadata: Any = None
    # Which LoRA adapter slot each token uses (`lora.batch.LoraBatch`); None: no adapter.
    lora: Any = None
    # Prompt embeddings that replace the embedding lookup: (token rows, [rows, hidden]).
    input_embeds: tuple[torch.Tensor, torch.Tensor] | None = None


_current: StepContext | None = None


def set_context(ctx: StepContext | None) -> None:
    global _current
    _current = ctx


def current_lora() -> Any:
    """The current step's LoRA batch, or None (no step, or no token uses an adapter)."""
    return None if _current is None else _current.lora


def get_context() -> StepContext:
    if _current is None:
        raise RuntimeError("no step context: the model runs only inside ModelRunner.execute")
    return _current
