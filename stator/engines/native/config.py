"""The native engine's flags (`NativeConfig`) and the model's shape read from `config.json`
(`ModelSpec`), so nothing below this module reads a Hugging Face config dict."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stator.config import option
from stator.engines.native.sharding import TPShard

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_bytes(text: str | int) -> int:
    """'4GiB', '512MB', '1e9'-free plain integers -> bytes. Binary units for the 'i' forms."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"not a memory size: {text!r} (try 2GiB, 512MiB or a byte count)")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    scale = 1024 ** ("kmgt".index(unit[0]) + 1) if "i" in unit else _UNITS[unit[:1]]
    return int(number * scale)


@dataclass
class NativeConfig:
    dtype: str = option(
        "auto",
        "Weight and KV dtype; auto = the checkpoint's dtype on CUDA, float32 on the CPU",
        choices=["auto", "float32", "bfloat16", "float16"],
    )
    device: str = option(
        "auto", "Where to run; auto = cuda when available", choices=["auto", "cpu", "cuda"]
    )
    block_size: int = option(16, "Tokens per KV cache block")
    kv_cache_memory: str = option(
        "",
        "Bytes for the KV cache (e.g. 2GiB); empty = --gpu-memory-utilization on CUDA, "
        "1GiB on the CPU",
    )
    gpu_memory_utilization: float = option(
        0.9, "Fraction of the GPU's memory the engine may use in all (weights + KV cache)"
    )
    max_num_seqs: int = option(256, "Most sequences in one batch")
    max_num_batched_tokens: int = option(8192, "Token budget of one engine step")
    max_prefill_chunk: int = option(
        0, "Most prompt tokens one request may compute per step (0 = up to the step budget)"
    )
    num_continuous_decode_steps: int = option(
        0,
        "Admit new prompts at most every N steps while sequences decode (SGLang's flag): "
        "the prompts that arrive meanwhile are prefilled in one step, so most steps are "
        "pure decode steps (lower median ITL, fewer host-heavy mixed steps) at the cost "
        "of up to N - 1 steps more TTFT and a larger step now and then; 1 = admit every "
        "step; 0 = auto: 4 on CUDA (H100, c=256: +3-6% output tok/s, per-token ITL p50 "
        "0.88x, TTFT p50 +40-90 ms), 1 on the CPU",
    )
    scheduling_policy: str = option(
        "fcfs",
        "Order waiting requests are admitted in (vLLM's flag; vLLM's other value is priority): "
        "fcfs = first come first served; lof = longest output (max_tokens) first, SGLang's "
        "--schedule-policy lof: with a backlog the long outputs start early instead of "
        "finishing alone at small batches; a request is passed by at most --max-num-seqs "
        "later arrivals, then goes first",
        choices=["fcfs", "lof"],
    )
    max_model_len: int = option(0, "Context length (0 = the model's max_position_embeddings)")
    enable_prefix_caching: bool = option(True, "Reuse KV blocks of earlier prompts")
    seed: int = option(0, "Seed of the engine's random generator (requests without a seed)")
    cpu_threads: int = option(
        0,
        "torch intra-op threads of the engine's steps on the CPU (0 = measured: all cores "
        "or half of them, whichever steps faster under the current load)",
    )
    attention_backend: str = option(
        "auto",
        "Paged attention kernels; auto = triton on CUDA, torch (gather + SDPA) elsewhere",
        choices=["auto", "torch", "triton"],
    )
    engine_core_process: str = option(
        "auto",
        "Run the engine core (scheduler, model, sampler) in a process of its own, fed one "
        "batched message per step, so the worker's HTTP and asyncio work never delays a "
        "step (vLLM does the same, VLLM_ENABLE_V1_MULTIPROCESSING); auto = on with CUDA "
        "for aggregated workers, off on the CPU (where the step, not the host, is slow)",
        choices=["auto", "on", "off"],
    )
    enforce_eager: bool = option(False, "Never use CUDA graphs")
    cudagraph_mode: str = option(
        "full_and_piecewise",
        "CUDA graphs on CUDA, as vLLM names them: full_and_piecewise = whole-pass graphs for "
        "decode steps and piecewise graphs (all but attention) for every other step of up "
        "to --piecewise-max-tokens; full_decode_only = mixed and prefill steps run eagerly",
        choices=["full_and_piecewise", "full_decode_only"],
    )
    piecewise_max_tokens: int = option(
        1024,
        "Largest step (in tokens) run as piecewise CUDA graphs; larger ones run eagerly. "
        "Eagerly a mixed step's launches cost the host ~30 ms (an H100 step of 240 decodes "
        "+ a 600-token prompt: 35.0 ms eager, 21.6 ms as pieces); past ~1,000 tokens its "
        "matmuls bound it anyway (240 decodes + a 1,400-token prompt: 42.0 ms as pieces, "
        "41.9 eager, the GPU busy 98-99% either way)",
    )
    overlap: str = option(
        "auto",
        "Schedule and prepare step n+1 while the device runs step n, reading sampled tokens "
        "one step late; auto = on for CUDA, off on the CPU",
        choices=["auto", "on", "off"],
    )
    tune_gemv: bool = option(
        True, "On CUDA, measure at start-up whether a split-K GEMV beats cuBLAS at batch <= 8"
    )
    max_graph_batch: int = option(
        0, "Largest decode batch run as a CUDA graph (0 = --max-num-seqs)"
    )
    load_format: str = option(
        "auto",
        "auto = the checkpoint's safetensors; dummy = random weights of the config's shape "
        "(benchmarks without a checkpoint)",
        choices=["auto", "dummy"],
    )
    grammar_threads: int = option(
        0,
        "Threads that fill structured output's token masks (0 = llguidance's default: 80% "
        "of the cores, at most 32)",
    )
    speculative_config: str = option(
        "",
        "Speculative decoding, as vLLM spells it (JSON): method ngram | draft_model | eagle3, "
        "num_speculative_tokens, model (the draft or EAGLE-3 head directory), "
        "prompt_lookup_max/min (ngram); empty = off",
        metavar="JSON",
    )
    moe_weights: str = option(
        "auto",
        "How MoE experts are held: bf16 = expanded to the model dtype; mxfp4 = packed as in "
        "the checkpoint, dequantized inside the kernel (~4x less memory); auto = mxfp4 on "
        "CUDA for MXFP4 checkpoints, the model dtype otherwise",
        choices=["auto", "bf16", "mxfp4"],
    )
    kv_offloading_size: float = option(
        0.0,
        "GiB of pinned host memory for KV blocks evicted from the GPU cache, loaded back "
        "instead of recomputed when a prompt needs them again (0 = no host tier; vLLM's "
        "name for its KV offloading buffer; its --cpu-offload-gb offloads weights)",
        metavar="GIB",
    )
    disk_offload_dir: str = option(
        "",
        "Directory of a disk tier below the host tier (blocks leaving host memory are "
        "written there; kept across restarts of the same model)",
    )
    disk_offload_gb: float = option(0.0, "GiB the disk tier may use in --disk-offload-dir")
    kv_load_policy: str = option(
        "auto",
        "Lower-tier hits: auto = load when the measured copy is faster than recomputing, "
        "always, never",
        choices=["auto", "always", "never"],
    )
    tensor_parallel_size: int = option(
        1,
        "GPUs (or CPU processes) one model is split over, Megatron style; ranks 1..N-1 run "
        "in subprocesses of the worker (NCCL on CUDA, gloo on the CPU)",
    )

    enable_lora: bool = option(
        False, "Serve LoRA adapters (PEFT format) next to the base model, many per batch"
    )
    max_loras: int = option(
        4, "Adapter slots on the device: the most distinct adapters in one batch (LRU)"
    )
    max_lora_rank: int = option(16, "Largest adapter rank served (slots are sized for it)")
    lora_modules: list[str] = option(
        [],
        "Adapters to load at start, name=path (a local directory or a Hugging Face repo "
        "id), comma-separated",
        metavar="NAME=PATH,...",
    )
    lora_allowed_dirs: list[str] = option(
        [],
        "Local directories run-time adapter loads (load_lora, /v1/load_lora_adapter) may "
        "read from; empty = local paths are refused at run time (repo ids still load)",
        metavar="DIR,...",
    )
    enable_sleep_mode: bool = option(
        False,
        "Allow sleep/wake (admin ops, /sleep and /wake_up): level 1 moves the weights to "
        "host memory and drops the KV cache, level 2 drops both (wake reloads them)",
    )
    enable_prompt_embeds: bool = option(
        False, "Accept prompt_embeds (embedding rows in place of prompt token ids)"
    )


_DTYPE_NAMES = {"float32", "bfloat16", "float16"}


@dataclass
class ModelSpec:
    """The shape of a decoder-only transformer, from its `config.json`."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    # A window every layer uses (Mistral); per-layer windows are in `layer_windows`.
    sliding_window: int | None
    checkpoint_dtype: str
    eos_token_ids: list[int]
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    # Per layer: its sliding window, 0 for full attention (config.json `layer_types`).
    layer_windows: list[int] = field(default_factory=list)
    # Mixture of experts: experts per layer (the whole model's, on every rank) and top-k.
    num_experts: int = 0
    experts_per_token: int = 0
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    # The part of the model this process holds (sharding.shard_spec); all of it by default.
    tp: TPShard = field(default_factory=TPShard)

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelSpec:
        model_dir = Path(model_dir)
        path = model_dir / "config.json"
        if not path.is_file():
            raise ValueError(
                f"{model_dir} has no config.json; is it a Hugging Face model directory?"
            )
        cfg = json.loads(path.read_text())
        gen_path = model_dir / "generation_config.json"
        gen = json.loads(gen_path.read_text()) if gen_path.is_file() else {}
        return cls.from_dicts(cfg, gen)

    @classmethod
    def from_dicts(cls, cfg: dict[str, Any], gen: dict[str, Any]) -> ModelSpec:
        archs = cfg.get("architectures") or []
        if not archs:
            raise ValueError("config.json names no architecture ('architectures' is empty)")
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        # transformers 5 moved rope_theta and rope_scaling into one `rope_parameters` dict.
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        theta = float(rope.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        rope_scaling = None if rope_type == "default" else {**rope, "rope_type": rope_type}
        dtype = str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32")
        window = cfg.get("sliding_window")
        if cfg.get("use_sliding_window") is False:  # Qwen2/3 carry a window they do not use
            window = None
        layer_types = cfg.get("layer_types") or []
        layer_windows = [
            int(window or 0) if kind == "sliding_attention" else 0 for kind in layer_types
        ]
        if layer_windows and not all(layer_windows):  # some layers slide, some do not
            window = None
        return cls(
            architecture=archs[0],
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            sliding_window=int(window) if window else None,
            checkpoint_dtype=dtype if dtype in _DTYPE_NAMES else "float32",
            eos_token_ids=_eos_ids(cfg, gen),
            generation_defaults={
                k: gen[k]
                for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
                if gen.get(k) is not None
            },
            layer_windows=layer_windows if any(layer_windows) else [],
            num_experts=int(cfg.get("num_local_experts") or cfg.get("num_experts") or 0),
            experts_per_token=int(cfg.get("num_experts_per_tok") or 0),
            raw=cfg,
        )


def _eos_ids(cfg: dict[str, Any], gen: dict[str, Any]) -> list[int]:
    out: list[int] = []
    for source in (gen.get("eos_token_id"), cfg.get("eos_token_id")):
        for value in source if isinstance(source, list) else [source]:
            if value is not None and int(value) not in out:
                out.append(int(value))
    return out
