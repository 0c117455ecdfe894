"""Tiny random-weight checkpoints of every supported architecture, written the way real ones
are (transformers `from_config` + `save_pretrained`), and helpers to drive the engine core.

Initializers leave some parameters zero or constant (biases, norm weights); they are
re-randomized so that every term of the forward pass is exercised and compared.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from stator.engines.native.config import NativeConfig
from stator.engines.native.engine_core import EngineCore
from stator.protocols import EngineOutput, EngineRequest, SamplingOptions, StopConditions
from tests.model_factory import make_model_dir

_SHAPE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,  # GQA ratio 2
    head_dim=16,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
)

ARCHITECTURES: dict[str, tuple[str, str, dict[str, Any]]] = {
    # name: (config class, architecture, extra config)
    "llama3": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        },
    ),
    "llama_tied": ("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": True}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 4096}),
    # A window shorter than the prompts, so that it bites.
    "mistral_window": ("MistralConfig", "MistralForCausalLM", {"sliding_window": 12}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    # An odd expert count, top-3, and a window (on layers 0 and 2) shorter than the prompts.
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        {"num_local_experts": 7, "num_experts_per_tok": 3, "sliding_window": 12},
    ),
    # Experts split across 2 tensor-parallel ranks (4 each).
    "gpt_oss_ep": (
        "GptOssConfig",
        "GptOssForCausalLM",
        {"num_local_experts": 8, "num_experts_per_tok": 4, "sliding_window": 12},
    ),
}


def rerandomize(model: torch.nn.Module, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.rand(p.shape, generator=gen) + 0.5)
            elif "lm_head" in name or "embed_tokens" in name:
                # Wide logits: greedy choices far from ties, so fp noise cannot flip them.
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


def build_model(
    path: Path, name: str, *, dtype: torch.dtype = torch.float32, max_shard_size: str | None = None
) -> tuple[Path, torch.nn.Module]:
    """Write a tiny checkpoint of architecture `name`; returns (dir, HF reference model)."""
    import transformers

    cls_name, arch, extra = ARCHITECTURES[name]
    make_model_dir(path, architecture=arch)
    vocab = len(transformers.PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json")))
    config = getattr(transformers, cls_name)(
        **_SHAPE, **extra, vocab_size=vocab, bos_token_id=1, eos_token_id=5
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation="eager"
    )
    rerandomize(model)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.to(dtype).save_pretrained(path, **kwargs)
    model.to(torch.float32).eval()
    return path, model


def core_for(model_dir: Path, **overrides: Any) -> EngineCore:
    values: dict[str, Any] = {"device": "cpu", "dtype": "float32", "kv_cache_memory": "4MiB"}
    values.update(overrides)
    return EngineCore(NativeConfig(**values), model_dir)


def greedy_request(rid: str, prompt: list[int], max_tokens: int, **sampling: Any) -> EngineRequest:
    options = {"temperature": 0.0, **sampling}
    return EngineRequest(
        request_id=rid,
        model="m",
        token_ids=list(prompt),
        sampling=SamplingOptions(**options),
        stop=StopConditions(max_tokens=max_tokens, ignore_eos=True),
    )


def run_all(core: EngineCore, requests: list[EngineRequest]) -> dict[str, list[EngineOutput]]:
    """Add every request, step until all finish, return each request's outputs."""
    outputs: dict[str, list[EngineOutput]] = {r.request_id: [] for r in requests}
    for r in requests:
        core.add_request(r)
    for _ in range(100_000):
        if not core.has_work():
            return outputs
        for rid, out in core.step():
            outputs[rid].append(out)
    raise AssertionError("the engine did not finish")


def tokens_of(outputs: list[EngineOutput]) -> list[int]:
    return [t for o in outputs for t in o.token_ids]


def prompt(seed: int, length: int, vocab: int = 1000) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (length,), generator=gen).tolist()


def hf_greedy(model: torch.nn.Module, prompt_ids: list[int], steps: int) -> list[int]:
    ids = torch.tensor([prompt_ids])
    out: list[int] = []
    with torch.no_grad():
        for _ in range(steps):
            nxt = int(model(ids).logits[0, -1].argmax())
            out.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out
