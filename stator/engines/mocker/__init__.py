"""The mocker: a simulated GPU engine (real scheduler and KV cache, simulated time).

engine = create_engine(MockerConfig(speedup_ratio=10), "/models/llama", "llama")
await engine.start()
async for out in engine.generate(request): ...
"""

from __future__ import annotations

from stator.engines.mocker.config import MockerConfig
from stator.engines.mocker.engine import MockerEngine
from stator.engines.mocker.model_info import read_model_info
from stator.protocols import ModelCard


def create_engine(config: MockerConfig, model_path: str, served_name: str) -> MockerEngine:
    """A mocker for the model in `model_path` (a directory with config.json and tokenizer
    files; no weights are read), serving under `served_name`."""
    config.validate()
    info = read_model_info(model_path)
    card = ModelCard(
        name=served_name,
        source_path=str(info.path),
        tokenizer_files=info.tokenizer_files,
        context_length=config.max_model_len or info.context_length,
        kv_block_size=config.block_size,
        total_kv_blocks=config.num_gpu_blocks,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        role=config.role,  # type: ignore[arg-type]
        eos_token_ids=info.eos_token_ids,
        data_parallel_size=config.data_parallel_size,
        engine="mocker",
    )
    kv_bytes = config.kv_bytes_per_token
    if kv_bytes is None:
        kv_bytes = info.kv_bytes_per_token
    return MockerEngine(
        config,
        card,
        vocab_size=config.vocab_size or info.vocab_size,
        kv_bytes_per_token=kv_bytes,
    )


__all__ = ["MockerConfig", "MockerEngine", "create_engine"]
