"""The model card a worker publishes: the engine's card, plus what the operator set on the
command line, plus the model's tokenizer and template files for frontends on other hosts."""

from __future__ import annotations

import logging
from pathlib import Path

import msgspec

from stator.protocols import ModelCard
from stator.worker.config import WorkerConfig

log = logging.getLogger(__name__)

# Files a frontend needs to build its pipeline (tokenizer, chat template, generation
# defaults, context length). Weights are never among them.
MODEL_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "generation_config.json",
    "config.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)


def model_files(model_dir: Path) -> list[Path]:
    return [model_dir / name for name in MODEL_FILES if (model_dir / name).is_file()]


def inline_files(paths: list[Path], limit: int) -> dict[str, bytes]:
    """The files' contents keyed by file name, or nothing when together they exceed
    `limit` bytes (a partial set would build a wrong pipeline)."""
    total = sum(p.stat().st_size for p in paths)
    if total > limit:
        log.info(
            "model files total %d bytes > %d: not inlined in the card; frontends must see %s",
            total,
            limit,
            paths[0].parent if paths else "the model directory",
        )
        return {}
    return {p.name: p.read_bytes() for p in paths}


def build_card(
    engine_card: ModelCard, config: WorkerConfig, served_name: str, model_dir: Path | None
) -> ModelCard:
    """The card to publish: the engine's own, with the operator's settings on top."""
    changes: dict = {"name": served_name, "migration_limit": config.migration_limit}
    if config.role != "aggregated":
        changes["role"] = config.role
    if config.reasoning_parser is not None:
        changes["reasoning_parser"] = config.reasoning_parser
    if config.tool_call_parser is not None:
        changes["tool_call_parser"] = config.tool_call_parser
    if config.max_model_len:
        if config.max_model_len < 0:
            raise ValueError(f"--max-model-len must be positive, got {config.max_model_len}")
        # The card must never promise more than the engine holds: a prompt between the two
        # would pass the frontend's check and fail in the engine.
        if config.max_model_len > engine_card.context_length:
            raise ValueError(
                f"--max-model-len {config.max_model_len} is more than the {engine_card.engine or 'engine'}"
                f" engine holds ({engine_card.context_length} tokens)"
            )
        changes["context_length"] = config.max_model_len
    if model_dir is not None and model_dir.is_dir():
        files = model_files(model_dir)
        if not engine_card.source_path:
            changes["source_path"] = str(model_dir)
        if not engine_card.tokenizer_files:
            changes["tokenizer_files"] = [str(p) for p in files]
        if not engine_card.files:
            changes["files"] = inline_files(files, config.inline_files_limit)
    return msgspec.structs.replace(engine_card, **changes)
