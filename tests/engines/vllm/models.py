"""Tiny random-weight models for the vLLM tests (nothing can be downloaded here).

Each builds on `tests.model_factory.make_model_dir` (trained BPE tokenizer + config) and
adds weights with transformers' `from_config`. Sizes are the smallest vLLM's CPU kernels
take comfortably: head_dim 64, two layers.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.model_factory import make_model_dir

HIDDEN = 128


def make_weights_model(path: Path, architecture: str, model_type: str, **extra: object) -> Path:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    make_model_dir(
        path,
        hidden_size=HIDDEN,
        num_heads=2,
        num_kv_heads=1,
        num_layers=2,
        architecture=architecture,
        model_type=model_type,
        max_position_embeddings=2048,
    )
    if extra:
        config_path = path / "config.json"
        config = json.loads(config_path.read_text())
        config.update(extra)
        config_path.write_text(json.dumps(config, indent=2))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    model.save_pretrained(path)
    return path


def make_llama(path: Path) -> Path:
    return make_weights_model(path, "LlamaForCausalLM", "llama")


def make_qwen3(path: Path) -> Path:
    return make_weights_model(path, "Qwen3ForCausalLM", "qwen3")


def make_lora(base: Path, path: Path, seed: int = 1) -> Path:
    """A PEFT LoRA adapter with non-zero B, so it visibly changes the output."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base)
    config = LoraConfig(
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        init_lora_weights=False,
    )
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.mul_(5.0)
    peft_model.save_pretrained(path)
    return path


def make_gpt_oss(path: Path) -> Path:
    """GPT-OSS: two layers (sliding + full attention), four experts, top-2, attention sinks."""
    return make_weights_model(
        path,
        "GptOssForCausalLM",
        "gpt_oss",
        num_local_experts=4,
        num_experts_per_tok=2,
        experts_per_token=2,
        intermediate_size=HIDDEN,
        sliding_window=128,
        layer_types=["sliding_attention", "full_attention"],
        torch_dtype="bfloat16",
    )


# o200k_harmony's special tokens that GPT-OSS's own files name (tests/parsers/harmony_vocab).
HARMONY_BOS, HARMONY_PAD, HARMONY_RETURN, HARMONY_CALL = 199998, 199999, 200002, 200012


def harmony_model_files(path: Path, tokenizer_json: Path, context: int = 2048) -> Path:
    """GPT-OSS's files (config, tokenizer, generation config; no weights) on the real
    o200k_harmony vocabulary (201088 ids), so that vLLM's and stator's Harmony chat paths
    run on it. Hidden size 64 keeps the two 201088-row matrices of the weights small."""
    make_model_dir(
        path,
        chat_template=None,
        hidden_size=64,
        num_heads=1,
        num_kv_heads=1,
        num_layers=2,
        architecture="GptOssForCausalLM",
        model_type="gpt_oss",
        max_position_embeddings=context,
    )
    (path / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    specials = {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"}  # fmt: skip
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": context,
        **specials,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    (path / "special_tokens_map.json").write_text(json.dumps(specials))
    config_path = path / "config.json"
    config = json.loads(config_path.read_text())
    config.update(
        vocab_size=201088,
        bos_token_id=HARMONY_BOS,
        eos_token_id=HARMONY_RETURN,
        pad_token_id=HARMONY_PAD,
        num_local_experts=4,
        num_experts_per_tok=2,
        experts_per_token=2,
        intermediate_size=64,
        sliding_window=128,
        layer_types=["sliding_attention", "full_attention"],
        torch_dtype="bfloat16",
    )
    config_path.write_text(json.dumps(config, indent=2))
    eos = [HARMONY_RETURN, HARMONY_PAD, HARMONY_CALL]
    (path / "generation_config.json").write_text(
        json.dumps({"bos_token_id": HARMONY_BOS, "eos_token_id": eos, "pad_token_id": HARMONY_PAD})
    )
    return path


def make_gpt_oss_harmony(path: Path, tokenizer_json: Path) -> Path:
    """`harmony_model_files` with random bfloat16 weights, for a real vLLM engine."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    harmony_model_files(path, tokenizer_json)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    model.to(torch.bfloat16).save_pretrained(path)
    return path
