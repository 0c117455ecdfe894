"""The model card a vLLM worker publishes, read from the engine's own resolved config
(block size, KV blocks, scheduler limits, EOS ids from config and generation config)."""

from __future__ import annotations

from typing import Any

from vllm.config import VllmConfig as VllmEngineConfig

from stator.protocols import ModelCard, Role


def vllm_model_card(
    cfg: VllmEngineConfig, served_name: str, model_path: str, role: Role
) -> ModelCard:
    eos_ids = _eos_ids(cfg.model_config.hf_config.eos_token_id)
    generation = cfg.model_config.try_get_generation_config() or {}
    eos_ids += [t for t in _eos_ids(generation.get("eos_token_id")) if t not in eos_ids]
    return ModelCard(
        name=served_name,
        source_path=model_path,
        context_length=cfg.model_config.max_model_len,
        kv_block_size=cfg.cache_config.block_size,
        total_kv_blocks=cfg.cache_config.num_gpu_blocks or 0,
        max_num_seqs=cfg.scheduler_config.max_num_seqs,
        max_num_batched_tokens=cfg.scheduler_config.max_num_batched_tokens,
        eos_token_ids=eos_ids,
        prompt_embeds_hidden_size=(
            cfg.model_config.get_hidden_size() if cfg.model_config.enable_prompt_embeds else 0
        ),
        engine="vllm",
        structured_output=True,  # vLLM's own structured-output backends
        role=role,
        kv_state_available=False,  # see VllmEngine.kv_state
        extra={"vllm_version": _vllm_version()},
    )


def _eos_ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else [int(v) for v in value]


def _vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))
