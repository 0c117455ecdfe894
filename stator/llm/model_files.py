"""`ModelFiles`: everything the frontend needs from a model's files, loaded once per model:
tokenizer, chat template, generation defaults, context length, EOS ids."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stator.llm.chat_template import ChatTemplate
from stator.llm.tokenizer import Tokenizer, TokenizerError, load_json, read_model_files
from stator.protocols import ModelCard

# generation_config.json fields that are request defaults (the rest describe the model).
GENERATION_DEFAULT_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "max_new_tokens",
)


@dataclass
class ModelFiles:
    tokenizer: Tokenizer
    chat_template: ChatTemplate | None
    generation_config: dict[str, Any] = field(default_factory=dict)
    context_length: int = 4096
    eos_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def from_dir(cls, path: str | Path, *, context_length: int | None = None) -> ModelFiles:
        return cls.from_files(read_model_files(path), context_length=context_length)

    @classmethod
    def from_card(cls, card: ModelCard) -> ModelFiles:
        """Read the card's local directory when this process can see it, else the files
        the card carries inline. The card's context length and template win."""
        source = Path(card.source_path) if card.source_path else None
        if source is not None and source.is_dir() and (source / "tokenizer.json").is_file():
            files: Mapping[str, bytes] = read_model_files(source)
        elif card.files:
            files = card.files
        else:
            raise TokenizerError(
                f"model {card.name!r}: {card.source_path!r} is not a local model directory "
                "and the card carries no tokenizer files"
            )
        loaded = cls.from_files(files, context_length=card.context_length or None)
        if card.chat_template:
            loaded.chat_template = ChatTemplate(
                card.chat_template, special_tokens=loaded.tokenizer.special_tokens_map
            )
        if card.eos_token_ids:
            loaded.eos_token_ids = list(dict.fromkeys([*card.eos_token_ids, *loaded.eos_token_ids]))
        return loaded

    @classmethod
    def from_files(
        cls, files: Mapping[str, bytes], *, context_length: int | None = None
    ) -> ModelFiles:
        tokenizer = Tokenizer.from_files(files)
        tokenizer.byte_level_table()  # build it now, not on the first request
        template = ChatTemplate.from_files(files)
        generation = load_json(files, "generation_config.json")
        defaults = {k: generation[k] for k in GENERATION_DEFAULT_FIELDS if k in generation}
        if context_length is None:
            config = load_json(files, "config.json")
            text_config = config.get("text_config")
            max_pos = config.get("max_position_embeddings")
            if max_pos is None and isinstance(text_config, dict):
                max_pos = text_config.get("max_position_embeddings")
            if isinstance(max_pos, int) and max_pos > 0:
                context_length = max_pos
            elif tokenizer.model_max_length:
                context_length = tokenizer.model_max_length
            else:
                context_length = 4096
        return cls(
            tokenizer=tokenizer,
            chat_template=template,
            generation_config=defaults,
            context_length=context_length,
            eos_token_ids=list(tokenizer.eos_token_ids),
        )
