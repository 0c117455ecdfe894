"""`VllmModel`: what vLLM's server builds for a model's text side, built from a card.

A `ModelConfig` over the model's directory (the card's `source_path`, or its inline files
written to a temporary one when the frontend cannot see that path), the renderer and
`OnlineRenderer` that `vllm serve` renders chats with, the `Parser` class its
`--reasoning-parser` / `--tool-call-parser` compose to, and the generation defaults and EOS
ids its engine applies. Building it reads config and tokenizer files (seconds on a busy
CPU): callers run it off the event loop.
"""

from __future__ import annotations

import atexit
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from stator.protocols import ModelCard

log = logging.getLogger(__name__)

# stator's parser names where vLLM's differ; any other name is passed to vLLM as it is,
# so a parser stator does not know is vLLM's to find.
REASONING_PARSERS = {"gpt_oss": "openai_gptoss"}
TOOL_CALL_PARSERS = {"harmony": "openai"}


def model_dir(card: ModelCard) -> Path:
    """A local directory with the model's config and tokenizer files."""
    source = Path(card.source_path) if card.source_path else None
    if source is not None and (source / "config.json").is_file():
        return source
    if "config.json" not in card.files:
        raise ValueError(
            f"model {card.name!r}: --processor vllm needs the model's config.json; "
            f"{card.source_path!r} is not a local model directory and the card carries none"
        )
    folder = Path(tempfile.mkdtemp(prefix="stator-vllm-processor-"))
    atexit.register(shutil.rmtree, folder, True)
    for name, data in card.files.items():
        (folder / Path(name).name).write_bytes(data)
    return folder


class VllmModel:
    def __init__(self, card: ModelCard) -> None:
        from vllm.config import ModelConfig, VllmConfig
        from vllm.parser import ParserManager
        from vllm.renderers.online_renderer import OnlineRenderer
        from vllm.renderers.registry import renderer_from_config

        folder = str(model_dir(card))
        self.config = ModelConfig(model=folder, tokenizer=folder, served_model_name=card.name)
        self.renderer = renderer_from_config(VllmConfig(model_config=self.config))
        self.tokenizer = self.renderer.get_tokenizer()
        reasoning = card.reasoning_parser
        tools = card.tool_call_parser
        self.reasoning_parser = REASONING_PARSERS.get(reasoning, reasoning) if reasoning else None
        self.tool_call_parser = TOOL_CALL_PARSERS.get(tools, tools) if tools else None
        self.harmony = self.config.hf_config.model_type == "gpt_oss"
        # As `vllm serve --enable-auto-tool-choice --tool-call-parser X` when the card
        # names a tool-call parser.
        self.enable_auto_tools = self.tool_call_parser is not None
        self.online = OnlineRenderer(
            self.config,
            self.renderer,
            request_logger=None,
            chat_template=card.chat_template,
            chat_template_content_format="auto",
            enable_auto_tools=self.enable_auto_tools,
            tool_parser=self.tool_call_parser,
            reasoning_parser=self.reasoning_parser,
        )
        self.parser_cls = ParserManager.get_parser(
            tool_parser_name=self.tool_call_parser,
            reasoning_parser_name=self.reasoning_parser,
            enable_auto_tools=self.enable_auto_tools,
            model_name=folder,
            is_harmony=self.harmony,
            tokenizer=self.tokenizer,
        )
        # The workers may serve less context than the model's config allows (vLLM's
        # server would be told so by --max-model-len): the card says what they serve.
        self.max_model_len = min(self.config.max_model_len, card.context_length or 1 << 62)
        self.default_sampling_params = self.config.get_diff_sampling_param()
        generation = self.config.try_get_generation_config() or {}
        # As vLLM's chat and completion servers compute it.
        self.override_max_tokens = (
            self.default_sampling_params.get("max_tokens")
            if self.config.generation_config not in ("auto", "vllm")
            else (getattr(self.config, "override_generation_config", None) or {}).get(
                "max_new_tokens"
            )
        )
        self.eos_token_ids = _eos_ids(self.tokenizer.eos_token_id, generation)

    def new_parser(self, tools: Any, chat_template_kwargs: dict[str, Any]) -> Any:
        """A fresh `Parser` for one choice (parsers keep stream state), or None."""
        if self.parser_cls is None:
            return None
        return self.parser_cls(
            self.tokenizer,
            tools,
            chat_template_kwargs=chat_template_kwargs,
            model_config=self.config,
        )


def _eos_ids(tokenizer_eos: int | None, generation: dict[str, Any]) -> list[int]:
    """The tokenizer's EOS and generation_config's, as vLLM's engine stops on them."""
    ids = [] if tokenizer_eos is None else [tokenizer_eos]
    extra = generation.get("eos_token_id")
    if isinstance(extra, int):
        extra = [extra]
    for token in extra or ():
        if isinstance(token, int) and token not in ids:
            ids.append(token)
    return ids
