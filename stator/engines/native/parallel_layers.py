"""Linear and embedding layers split over tensor-parallel ranks (Megatron style).

- Column-parallel (q/k/v, gate/up): each rank computes its block of output rows; no
  communication, the heads (or MLP columns) it owns stay local.
- Row-parallel (o, down): each rank multiplies its block of input columns, then one
  all-reduce sums the partial outputs. A bias is held by rank 0 only (zeros elsewhere), so
  the sum adds it once.
- Vocab-parallel embedding and LM head: each rank holds `ceil(vocab / size)` rows. The
  embedding looks up the ids in its block (zeros for the rest) and all-reduces; the LM
  head computes its block of logits and all-gathers them. A gathered head (not a
  replicated one) keeps a 128k-vocabulary head (1 GiB in bf16 at 8B) split like every
  other weight, lets a tied head share the embedding's shard, and splits its matmul
  across GPUs; the gather moves only [rows, vocab] logits of the sampled rows.

With `TPShard.size == 1` every layer is the plain single-device layer.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stator.engines.native import parallel
from stator.engines.native.config import ModelSpec
from stator.engines.native.layers import Linear, MergedLinear
from stator.engines.native.sharding import TPShard, read_all, shape_of


class ColumnParallelLinear(MergedLinear):
    """Fused projections whose output rows are split over ranks. `shards` maps a
    checkpoint shard id to (rows this rank holds, the checkpoint rows they come from)."""

    def __init__(self, in_features: int, shards: dict[Any, tuple[int, slice]], bias: bool):
        super().__init__(in_features, {k: rows for k, (rows, _) in shards.items()}, bias=bias)
        self._sources = {k: source for k, (_, source) in shards.items()}

    def load_shard(self, param: nn.Parameter, loaded: Any, shard: Any = None) -> None:
        super().load_shard(param, loaded[self._sources[shard]], shard)


def qkv_linear(spec: ModelSpec, bias: bool) -> ColumnParallelLinear:
    """q, k, v of this rank's heads (`spec` is the rank's own, from `shard_spec`)."""
    tp = spec.tp
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    shards = {"q": (q, tp.block(q)), "k": (kv, tp.kv_block(kv)), "v": (kv, tp.kv_block(kv))}
    return ColumnParallelLinear(spec.hidden_size, shards, bias)


def gate_up_linear(spec: ModelSpec) -> ColumnParallelLinear:
    inter = spec.intermediate_size
    block = spec.tp.block(inter)
    return ColumnParallelLinear(spec.hidden_size, {0: (inter, block), 1: (inter, block)}, False)


class RowParallelLinear(Linear):
    """y = sum over ranks of x_r @ W_r^T (+ bias once); `in_features` is this rank's block."""

    def __init__(self, in_features: int, out_features: int, tp: TPShard, bias: bool) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.tp = tp

    def load_shard(self, param: nn.Parameter, loaded: Any, shard: Any = None) -> None:
        if param is self.bias:
            full = read_all(loaded)
            super().load_shard(param, full if self.tp.rank == 0 else torch.zeros_like(full))
        else:
            super().load_shard(param, loaded[:, self.tp.block(self.in_features)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return parallel.all_reduce(y) if self.tp.size > 1 else y


def _load_vocab_rows(param: nn.Parameter, loaded: Any, vocab: int, start: int) -> None:
    shape = shape_of(loaded)
    if shape != (vocab, param.shape[1]):
        raise ValueError(f"weight shape {shape} != expected {(vocab, param.shape[1])}")
    part = loaded[start : start + param.shape[0]]  # the last block may be short
    param.data[: part.shape[0]].copy_(part)
    param.data[part.shape[0] :].zero_()


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab: int, hidden: int, tp: TPShard) -> None:
        super().__init__()
        self.vocab, self.tp = vocab, tp
        self.start, rows = tp.vocab_block(vocab)
        self.weight = nn.Parameter(torch.empty(rows, hidden))
        self.weight.weight_loader = self.load  # type: ignore[attr-defined]

    def load(self, param: nn.Parameter, loaded: Any, shard: Any = None) -> None:
        _load_vocab_rows(param, loaded, self.vocab, self.start)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        x = F.embedding(local.masked_fill(outside, 0), self.weight)
        return parallel.all_reduce(x.masked_fill_(outside.unsqueeze(-1), 0))


class ParallelLMHead(Linear):
    """Logits [T, vocab]: each rank's block of the vocabulary, gathered on every rank."""

    def __init__(self, vocab: int, hidden: int, tp: TPShard) -> None:
        start, rows = tp.vocab_block(vocab)
        super().__init__(hidden, rows)
        self.vocab, self.tp, self.start = vocab, tp, start
        self.weight.weight_loader = self.load  # type: ignore[attr-defined]

    def load(self, param: nn.Parameter, loaded: Any, shard: Any = None) -> None:
        _load_vocab_rows(param, loaded, self.vocab, self.start)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().forward(x)
        if self.tp.size == 1:
            return logits
        return parallel.all_gather_last(logits, self.tp.size)[:, : self.vocab]
