"""GPT-OSS beyond the shared per-architecture checks (test_models.py): the sliding window
under chunked prefill and prefix-cache hits, the published MXFP4 checkpoint layout, the
real models' config.json, and the parsers a GPT-OSS card selects."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from stator.engines.native.config import ModelSpec
from stator.engines.native.models.gpt_oss import _deinterleave
from tests.engines.native.models import (
    core_for,
    greedy_request,
    hf_greedy,
    prompt,
    run_all,
    tokens_of,
)
from tests.engines.native.test_models import engine_prompt_logits, relative_error

WINDOW = 12  # tests/engines/native/models.py: "gpt_oss"


@pytest.fixture(scope="module")
def gpt_oss(checkpoints):
    return checkpoints("gpt_oss")


def test_chunked_prefill_across_the_window_matches_transformers(gpt_oss):
    model_dir, hf = gpt_oss
    ids = prompt(5, 41)  # > 3 windows
    expected = hf_greedy(hf, ids, 32)
    # 5-token chunks: every chunk's queries see keys of earlier chunks, some out of window.
    core = core_for(model_dir, max_prefill_chunk=5, max_num_batched_tokens=16)
    assert tokens_of(run_all(core, [greedy_request("r", ids, 32)])["r"]) == expected


def test_prefix_cache_hits_across_the_window_match_transformers(gpt_oss):
    model_dir, hf = gpt_oss
    shared = prompt(6, 48)  # 3 blocks of 16 shared, longer than the window
    a, b = shared + prompt(7, 5), shared + prompt(8, 9)
    core = core_for(model_dir)
    first = run_all(core, [greedy_request("a", a, 16)])["a"]
    second = run_all(core, [greedy_request("b", b, 16)])["b"]
    assert second[0].cached_tokens >= 32
    assert tokens_of(first) == hf_greedy(hf, a, 16)
    assert tokens_of(second) == hf_greedy(hf, b, 16)


def test_batched_mixed_lengths_match_transformers(gpt_oss):
    model_dir, hf = gpt_oss
    prompts = {f"r{n}": prompt(n, n) for n in (3, 11, 13, 30)}
    outs = run_all(core_for(model_dir), [greedy_request(r, p, 12) for r, p in prompts.items()])
    for rid, ids in prompts.items():
        assert tokens_of(outs[rid]) == hf_greedy(hf, ids, 12), rid


# -- the published checkpoint layout: experts in MXFP4 ----------------------------------


def _mxfp4_checkpoint(tmp_path, model_dir, hf):
    """The tiny model with its experts replaced by random MXFP4 ones in the published
    layout; returns (dir, HF model with transformers' own dequantization loaded)."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    out = tmp_path / "mxfp4"
    shutil.copytree(model_dir, out)
    tensors = load_file(str(out / "model.safetensors"))
    gen = torch.Generator().manual_seed(3)
    state = {}
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        w = tensors.pop(name)  # [E, in, out]
        experts, cols, rows = w.shape
        blocks = torch.randint(0, 256, (experts, rows, cols // 32, 16), generator=gen)
        scales = torch.randint(121, 126, (experts, rows, cols // 32), generator=gen)
        tensors[name + "_blocks"] = blocks.to(torch.uint8)
        tensors[name + "_scales"] = scales.to(torch.uint8)
        state[name] = convert_moe_packed_tensors(
            tensors[name + "_blocks"], tensors[name + "_scales"], dtype=torch.float32
        )
    save_file(tensors, str(out / "model.safetensors"))
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (out / "config.json").write_text(json.dumps(config))
    ref = type(hf)(hf.config).eval()
    ref.load_state_dict({**hf.state_dict(), **state})
    return out, ref, state


def test_mxfp4_dequantization_is_bit_identical_to_transformers(tmp_path, gpt_oss):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    model_dir, hf = gpt_oss
    out, _ref, _state = _mxfp4_checkpoint(tmp_path, model_dir, hf)
    tensors = load_file(str(out / "model.safetensors"))
    core = core_for(out, dtype="bfloat16", moe_weights="bf16")
    for i, moe in enumerate(core.runner.model.moe_layers()):
        for ours, ckpt in ((moe.w13, "gate_up_proj"), (moe.w2, "down_proj")):
            prefix = f"model.layers.{i}.mlp.experts.{ckpt}"
            theirs = convert_moe_packed_tensors(  # [E, in, out], bf16
                tensors[prefix + "_blocks"], tensors[prefix + "_scales"]
            ).transpose(1, 2)
            if ckpt == "gate_up_proj":
                theirs = _deinterleave(theirs)
            assert ours.dtype == torch.bfloat16
            assert torch.equal(ours, theirs)


@pytest.mark.parametrize("moe_weights", ["bf16", "mxfp4"])
def test_mxfp4_checkpoint_matches_transformers(tmp_path, gpt_oss, moe_weights):
    model_dir, hf = gpt_oss
    out, ref, _ = _mxfp4_checkpoint(tmp_path, model_dir, hf)
    core = core_for(out, moe_weights=moe_weights)
    moe = core.runner.model.moe_layers()[0]
    assert moe.packed == (moe_weights == "mxfp4")
    ids = prompt(9, 40)
    with torch.no_grad():
        expected = ref(torch.tensor([ids])).logits[0]
    assert relative_error(engine_prompt_logits(core, ids), expected) < 1e-4
    got = run_all(core, [greedy_request("r", ids, 32)])["r"]
    assert tokens_of(got) == hf_greedy(ref, ids, 32)


def test_mxfp4_weights_need_an_mxfp4_checkpoint(gpt_oss):
    model_dir, _ = gpt_oss
    with pytest.raises(ValueError, match="moe-weights mxfp4 needs an MXFP4 checkpoint"):
        core_for(model_dir, moe_weights="mxfp4")


def test_auto_keeps_cpu_experts_expanded(gpt_oss):
    model_dir, _ = gpt_oss
    assert not core_for(model_dir).runner.model.moe_layers()[0].packed


# -- the real models' shapes ---------------------------------------------------------------

GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_hidden_layers": 24,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 201088,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "rope_theta": 150000,
    "rope_scaling": {
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "rope_type": "yarn",
        "truncate": False,
    },
    "max_position_embeddings": 131072,
    "attention_bias": True,
    "eos_token_id": 200002,
    "torch_dtype": "bfloat16",
}


def test_the_published_config_reads_as_gpt_oss():
    spec = ModelSpec.from_dicts(GPT_OSS_20B, {"eos_token_id": [200002, 199999, 200012]})
    assert (spec.num_experts, spec.experts_per_token) == (32, 4)
    assert spec.layer_windows == [128, 0] * 12
    assert spec.sliding_window is None  # not every layer slides
    assert spec.rope_theta == 150000 and spec.rope_scaling["rope_type"] == "yarn"
    assert spec.eos_token_ids == [200002, 199999, 200012]


def test_experts_split_whole_across_ranks():
    from stator.engines.native.sharding import shard_spec

    spec = ModelSpec.from_dicts(GPT_OSS_20B, {})
    rank = shard_spec(spec, 1, 4)
    assert rank.intermediate_size == 2880 and rank.num_experts == 32
    assert (rank.num_heads, rank.num_kv_heads) == (16, 2)
    with pytest.raises(ValueError, match="num_local_experts=32"):
        shard_spec(spec, 0, 3)
