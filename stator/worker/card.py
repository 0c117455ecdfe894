"""The model card a worker publishes: the engine's card, plus what the operator set on the
command line, plus the model's tokenizer and template files for frontends on other hosts."""

from __future__ import annotations

import json
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


# config.json `model_type` -> (reasoning parser, tool-call parser) a model of that type
# needs to answer at all (GPT-OSS writes only Harmony channels); --reasoning-parser and
# --tool-call-parser still win.
MODEL_TYPE_PARSERS = {"gpt_oss": ("gpt_oss", "harmony")}


def default_parsers(model_dir: Path | None) -> tuple[str | None, str | None]:
    path = model_dir / "config.json" if model_dir is not None else None
    if path is None or not path.is_file():
        return None, None
    try:
        model_type = json.loads(path.read_text()).get("model_type")
    except (OSError, ValueError):
        return None, None
    return MODEL_TYPE_PARSERS.get(model_type, (None, None))


def build_card(
    engine_card: ModelCard, config: WorkerConfig, served_name: str, model_dir: Path | None
) -> ModelCard:
    """The card to publish: the engine's own, with the operator's settings on top."""
    changes: dict = {"name": served_name, "migration_limit": config.migration_limit}
    if config.role != "aggregated":
        changes["role"] = config.role
    reasoning, tools = default_parsers(model_dir)
    reasoning = config.reasoning_parser or engine_card.reasoning_parser or reasoning
    tools = config.tool_call_parser or engine_card.tool_call_parser or tools
    if reasoning is not None:
        changes["reasoning_parser"] = reasoning
    if tools is not None:
        changes["tool_call_parser"] = tools
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
