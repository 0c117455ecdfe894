"""The native engine's model card, built from what its core reports (`CoreInfo`): the
same card whether the core runs in the worker's process or in its own."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from stator.engines.native.config import NativeConfig
from stator.protocols import LoraInfo, ModelCard

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)


class CoreInfo(msgspec.Struct, kw_only=True):
    """What the card needs from a started engine core (sent once by a core process)."""

    # What one sequence can really hold: a prompt past the KV cache's capacity is refused
    # by the frontend's context check (400), never by the engine.
    max_total_tokens: int
    num_blocks: int
    eos_token_ids: list[int]
    structured_output: bool
    hidden_size: int

    @classmethod
    def of(cls, core) -> CoreInfo:
        return cls(
            max_total_tokens=core.max_total_tokens,
            num_blocks=core.blocks.num_blocks,
            eos_token_ids=list(core.spec.eos_token_ids),
            structured_output=core.guidance.available,
            hidden_size=core.spec.hidden_size,
        )


def native_card(
    config: NativeConfig,
    model_path: str,
    served_name: str,
    info: CoreInfo,
    loras: list[LoraInfo],
) -> ModelCard:
    model_dir = Path(model_path)
    return ModelCard(
        name=served_name,
        source_path=model_path,
        tokenizer_files=[
            str(model_dir / name) for name in TOKENIZER_FILES if (model_dir / name).is_file()
        ],
        chat_template=read_chat_template(model_dir),
        context_length=info.max_total_tokens,
        kv_block_size=config.block_size,
        total_kv_blocks=info.num_blocks,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        eos_token_ids=list(info.eos_token_ids),
        structured_output=info.structured_output,
        prompt_embeds_hidden_size=info.hidden_size if config.enable_prompt_embeds else 0,
        loras=loras,
        engine="native",
    )


def read_chat_template(model_dir: str | Path) -> str | None:
    model_dir = Path(model_dir)
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    config = model_dir / "tokenizer_config.json"
    if not config.is_file():
        return None
    template = json.loads(config.read_text()).get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        named = {t.get("name"): t.get("template") for t in template}
        return named.get("default") or next(iter(named.values()), None)
    return template
