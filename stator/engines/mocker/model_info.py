"""What the mocker reads from a model directory: context length, vocabulary, KV size, EOS,
and the tokenizer files the frontend needs. No weights are ever loaded."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Files a frontend may need to build the tokenizer and chat template.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "special_tokens_map.json",
    "generation_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)

_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float8": 1}


@dataclass
class ModelInfo:
    path: Path
    context_length: int = 4096
    vocab_size: int = 32000
    kv_bytes_per_token: int = 0
    eos_token_ids: list[int] = field(default_factory=list)
    tokenizer_files: list[str] = field(default_factory=list)


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return data


def read_model_info(model_path: str | Path) -> ModelInfo:
    path = Path(model_path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{path} has no config.json (the mocker needs one for its shape)")
    cfg = _read_json(config_file)
    text = cfg.get("text_config") or cfg  # multimodal configs nest the language model's
    context = (
        text.get("max_position_embeddings")
        or text.get("max_seq_len")
        or text.get("seq_length")
        or text.get("n_positions")
        or 4096
    )
    layers = int(text.get("num_hidden_layers") or text.get("n_layer") or 0)
    heads = int(text.get("num_attention_heads") or text.get("n_head") or 0)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    hidden = int(text.get("hidden_size") or text.get("n_embd") or 0)
    head_dim = int(text.get("head_dim") or (hidden // heads if heads else 0))
    dtype = str(text.get("torch_dtype") or cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    kv_bytes = layers * 2 * kv_heads * head_dim * _DTYPE_BYTES.get(dtype, 2)
    eos = _ids(cfg.get("eos_token_id") or text.get("eos_token_id"))
    gen_file = path / "generation_config.json"
    if gen_file.is_file():
        eos = _ids(_read_json(gen_file).get("eos_token_id")) or eos
    files = [str(path / name) for name in TOKENIZER_FILES if (path / name).is_file()]
    return ModelInfo(
        path=path,
        context_length=int(context),
        vocab_size=int(text.get("vocab_size") or 32000),
        kv_bytes_per_token=kv_bytes,
        eos_token_ids=eos,
        tokenizer_files=files,
    )
