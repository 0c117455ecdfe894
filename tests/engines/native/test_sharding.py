"""Tensor-parallel shard math and sharded checkpoint loading, in one process (the
multi-process runs are in test_tp.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from stator.engines.native.attention import TorchAttention
from stator.engines.native.config import ModelSpec
from stator.engines.native.loader import load_weights
from stator.engines.native.models import model_class
from stator.engines.native.parallel_layers import RowParallelLinear
from stator.engines.native.sharding import TPShard, check_divisible, shard_spec


def _spec(**changes) -> ModelSpec:
    base = ModelSpec.from_dicts(
        {
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": 1001,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
        },
        {},
    )
    return dataclasses.replace(base, **changes)


def test_shard_spec_splits_heads_and_mlp():
    spec = shard_spec(_spec(), rank=1, size=2)
    assert (spec.num_heads, spec.num_kv_heads, spec.intermediate_size) == (4, 1, 64)
    assert spec.tp == TPShard(rank=1, size=2, kv_replicas=1)
    assert spec.hidden_size == 64 and spec.vocab_size == 1001  # not split by the spec


def test_more_ranks_than_kv_heads_replicate_them():
    spec = shard_spec(_spec(), rank=3, size=4)
    assert (spec.num_heads, spec.num_kv_heads) == (2, 1)
    assert spec.tp.kv_replicas == 2
    # Ranks 0, 1 hold KV head 0; ranks 2, 3 hold KV head 1.
    assert [TPShard(r, 4, 2).kv_block(16) for r in range(4)] == [
        slice(0, 16),
        slice(0, 16),
        slice(16, 32),
        slice(16, 32),
    ]


def test_vocab_blocks_cover_the_vocabulary_padded():
    blocks = [TPShard(r, 4).vocab_block(1001) for r in range(4)]
    assert blocks == [(0, 251), (251, 251), (502, 251), (753, 251)]
    assert blocks[-1][0] + blocks[-1][1] >= 1001


@pytest.mark.parametrize(
    ("changes", "size", "message"),
    [
        ({"num_heads": 6, "num_kv_heads": 6}, 4, "num_attention_heads=6"),
        ({"num_kv_heads": 3, "num_heads": 12}, 2, "num_key_value_heads=3"),
        ({"intermediate_size": 100}, 8, "intermediate_size=100"),
        ({}, 0, "at least 1"),
    ],
)
def test_sizes_that_do_not_divide_the_model_are_clear_errors(changes, size, message):
    with pytest.raises(ValueError, match=message):
        check_divisible(_spec(**changes), size)


def test_size_one_is_the_whole_model():
    spec = _spec()
    assert shard_spec(spec, 0, 1) is spec


def _sharded_model(model_dir, rank: int, size: int) -> torch.nn.Module:
    spec = shard_spec(ModelSpec.from_dir(model_dir), rank, size)
    model = model_class(spec.architecture)(spec, TorchAttention(), 64)
    load_weights(model, model_dir)
    return model


@pytest.mark.parametrize("size", [2, 4])
def test_each_rank_loads_its_rows_and_columns_of_the_checkpoint(checkpoints, size):
    """Against the reference model's tensors: q/k/v rows of the rank's heads (KV heads
    shared by two ranks at size 4), gate/up rows, o/down columns, vocabulary rows."""
    model_dir, ref = checkpoints("qwen2")  # biases on q, k, v: sharded with their rows
    ref_attn, ref_mlp = ref.model.layers[1].self_attn, ref.model.layers[1].mlp
    d = 16
    for rank in range(size):
        model = _sharded_model(model_dir, rank, size)
        attn, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
        heads, kv_heads, replicas = 4 // size, max(1, 2 // size), max(1, size // 2)
        q = slice(rank * heads * d, (rank + 1) * heads * d)
        group = rank // replicas  # size 4: ranks 0, 1 read KV head 0; ranks 2, 3 head 1
        kv = slice(group * kv_heads * d, (group + 1) * kv_heads * d)
        expected_qkv = torch.cat(
            [ref_attn.q_proj.weight[q], ref_attn.k_proj.weight[kv], ref_attn.v_proj.weight[kv]]
        )
        torch.testing.assert_close(attn.qkv_proj.weight, expected_qkv)
        expected_bias = torch.cat(
            [ref_attn.q_proj.bias[q], ref_attn.k_proj.bias[kv], ref_attn.v_proj.bias[kv]]
        )
        torch.testing.assert_close(attn.qkv_proj.bias, expected_bias)
        torch.testing.assert_close(attn.o_proj.weight, ref_attn.o_proj.weight[:, q])
        inter = 128 // size
        cols = slice(rank * inter, (rank + 1) * inter)
        torch.testing.assert_close(
            mlp.gate_up_proj.weight,
            torch.cat([ref_mlp.gate_proj.weight[cols], ref_mlp.up_proj.weight[cols]]),
        )
        torch.testing.assert_close(mlp.down_proj.weight, ref_mlp.down_proj.weight[:, cols])
        vocab = ref.config.vocab_size
        start, rows = TPShard(rank, size).vocab_block(vocab)
        emb = model.model.embed_tokens.weight
        real = min(rows, vocab - start)
        torch.testing.assert_close(emb[:real], ref.model.embed_tokens.weight[start : start + real])
        assert not emb[real:].any()  # padding rows past the vocabulary
        torch.testing.assert_close(
            model.lm_head.weight[:real], ref.lm_head.weight[start : start + real]
        )


def test_a_row_parallel_layer_reads_its_columns_and_rank_0_holds_the_bias():
    """The all-reduce sums the ranks' outputs, so the bias must be added once."""
    weight, bias = torch.randn(4, 16), torch.randn(4)
    x = torch.randn(3, 16)
    total = torch.zeros(3, 4)
    for rank in (0, 1):
        layer = RowParallelLinear(8, 4, TPShard(rank, 2), bias=True)
        layer.load_shard(layer.weight, weight)
        layer.load_shard(layer.bias, bias)
        torch.testing.assert_close(layer.weight, weight[:, rank * 8 : (rank + 1) * 8])
        total += torch.nn.Linear.forward(layer, x[:, rank * 8 : (rank + 1) * 8])
    torch.testing.assert_close(total, x @ weight.T + bias)
