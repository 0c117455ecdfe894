"""Each architecture against Hugging Face transformers' own implementation (float32)."""

from __future__ import annotations

import json

import pytest
import torch

from stator.engines.native.config import ModelSpec
from stator.engines.native.request import SamplingSpec, Sequence
from tests.engines.native.models import (
    build_model,
    core_for,
    greedy_request,
    hf_greedy,
    prompt,
    run_all,
    tokens_of,
)


def engine_prompt_logits(core, ids: list[int]) -> torch.Tensor:
    """Logits at every prompt position, computed by the paged engine in one step."""
    seq = Sequence("probe", list(ids), len(ids), SamplingSpec(), core.max_total_tokens)
    assert core.blocks.admit(seq, len(ids))
    inputs = core.runner.prepare([seq], [len(ids)], list(range(len(ids))))
    logits = core.runner.execute(inputs)
    core.blocks.free(seq)
    return logits


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm(dim=-1).max() / b.norm(dim=-1).min())


def test_prompt_logits_match_transformers(checkpoints, architecture):
    model_dir, hf = checkpoints(architecture)
    ids = prompt(1, 45)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    ours = engine_prompt_logits(core_for(model_dir), ids)
    assert relative_error(ours, ref) < 1e-4


def test_32_greedy_tokens_match_transformers(checkpoints, architecture):
    model_dir, hf = checkpoints(architecture)
    ids = prompt(2, 37)
    expected = hf_greedy(hf, ids, 32)
    out = run_all(core_for(model_dir), [greedy_request("r", ids, 32)])["r"]
    assert tokens_of(out) == expected
    assert out[-1].finish_reason == "length"


def test_sharded_checkpoint_loads_the_same(tmp_path, llama):
    model_dir, _hf = llama
    sharded, _ = build_model(tmp_path / "sharded", "llama3", max_shard_size="100KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    ids = prompt(3, 20)
    a = engine_prompt_logits(core_for(model_dir), ids)
    b = engine_prompt_logits(core_for(sharded), ids)
    assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_checkpoints_run_close_to_float32(tmp_path, dtype):
    torch_dtype = getattr(torch, dtype)
    model_dir, hf = build_model(tmp_path / dtype, "qwen3", dtype=torch_dtype)
    assert ModelSpec.from_dir(model_dir).checkpoint_dtype == dtype
    ids = prompt(4, 30)
    with torch.no_grad():
        ref = hf.to(torch_dtype).float()(torch.tensor([ids])).logits[0]
    core = core_for(model_dir, dtype=dtype)
    assert core.runner.dtype == torch_dtype
    ours = engine_prompt_logits(core, ids)
    assert relative_error(ours, ref) < 5e-2
    top1 = (ours.argmax(-1) == ref.argmax(-1)).float().mean()
    assert top1 >= 0.9


def test_unknown_architecture_is_a_clear_error(tmp_path, llama):
    model_dir, _ = llama
    config = json.loads((model_dir / "config.json").read_text())
    config["architectures"] = ["GPTBigCodeForCausalLM"]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match=r"GPTBigCodeForCausalLM.*supported: .*LlamaForCausalLM.*Qwen3ForCausalLM"
    ):
        core_for(bad)


def test_missing_weights_are_reported(tmp_path, llama):
    from safetensors.torch import load_file, save_file

    model_dir, _ = llama
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "generation_config.json", "tokenizer.json"):
        (broken / name).write_bytes((model_dir / name).read_bytes())
    tensors = load_file(str(model_dir / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(ValueError, match="gate_up_proj"):
        core_for(broken)


def test_unsupported_activation_is_a_clear_error(tmp_path, llama):
    model_dir, _ = llama
    odd = tmp_path / "odd"
    odd.mkdir()
    for name in ("config.json", "model.safetensors"):
        (odd / name).write_bytes((model_dir / name).read_bytes())
    config = json.loads((odd / "config.json").read_text())
    config["hidden_act"] = "gelu"
    (odd / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="hidden_act 'gelu'"):
        core_for(odd)
