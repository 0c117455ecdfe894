"""Model directories (config and tokenizer files, no weights: processors read nothing
else) for the processor parity tests, and both processors built over one card."""

from __future__ import annotations

import json
from pathlib import Path

from stator.frontend.metrics import FrontendMetrics
from stator.frontend.processor import Processor, create_processor
from stator.protocols import ModelCard
from tests.engines.vllm.harmony import harmony_tokenizer_json
from tests.engines.vllm.models import harmony_model_files
from tests.frontend.parser_stack import TOOLS_TEMPLATE
from tests.model_factory import make_model_dir

# Qwen3 / Hermes markers as single tokens, as in the real vocabularies (vLLM's parsers
# look them up by id; stator's read text). Not special: decoding keeps them.
# Room for the corpus's longest request on the tiny tokenizer.
CONTEXT = 32768
MARKER_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>")


def add_tokens(model_dir: Path, tokens: tuple[str, ...]) -> None:
    path = model_dir / "tokenizer.json"
    data = json.loads(path.read_text())
    next_id = 1 + max([*data["model"]["vocab"].values(), *(t["id"] for t in data["added_tokens"])])
    for i, token in enumerate(tokens):
        data["added_tokens"].append(
            {
                "id": next_id + i,
                "content": token,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": False,
            }
        )
    path.write_text(json.dumps(data))
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    config["vocab_size"] = max(config.get("vocab_size", 0), next_id + len(tokens))
    config_path.write_text(json.dumps(config))


def chatml_model(path: Path) -> Path:
    """The tests' tiny ChatML model."""
    return make_model_dir(path, max_position_embeddings=CONTEXT)


# The parser tests' tool-aware ChatML template, writing a call's arguments as Qwen3's and
# Hermes' templates do: a string as it is, an object as JSON. vLLM parses the arguments of
# past calls into objects before rendering, stator passes what the client sent (docs/vllm.md
# "Deliberate differences"); templates written this way render both alike.
ARGUMENTS = "{{ call.function.arguments }}"
PARITY_TOOLS_TEMPLATE = TOOLS_TEMPLATE.replace(
    ARGUMENTS,
    "{% if call.function.arguments is string %}{{ call.function.arguments }}"
    "{% else %}{{ call.function.arguments | tojson }}{% endif %}",
)
assert PARITY_TOOLS_TEMPLATE != TOOLS_TEMPLATE


def tools_model(path: Path) -> Path:
    """The tiny model with a tool-aware ChatML template (tools, tool calls, tool results,
    Qwen3's `enable_thinking`) and the Qwen3 / Hermes markers as tokens."""
    model_dir = make_model_dir(
        path, chat_template=PARITY_TOOLS_TEMPLATE, max_position_embeddings=CONTEXT
    )
    add_tokens(model_dir, MARKER_TOKENS)
    return model_dir


def tools_card(directory: Path) -> ModelCard:
    """`tools_model`'s card, with Qwen3 reasoning and Hermes tool calls."""
    return ModelCard(
        name="m",
        source_path=str(tools_model(directory)),
        context_length=CONTEXT,
        reasoning_parser="qwen3",
        tool_call_parser="hermes",
    )


# GPT-OSS's own context, for the corpus's longest request on o200k_harmony.
HARMONY_CONTEXT = 131072


def harmony_card(directory: Path) -> ModelCard:
    """GPT-OSS's files on the real o200k_harmony vocabulary (skips where it cannot be
    rebuilt) and their card, with Harmony reasoning and tool calls."""
    model_dir = harmony_model_files(directory, harmony_tokenizer_json(), context=HARMONY_CONTEXT)
    return ModelCard(
        name="m",
        source_path=str(model_dir),
        context_length=HARMONY_CONTEXT,
        reasoning_parser="gpt_oss",
        tool_call_parser="harmony",
    )


async def both_processors(card: ModelCard) -> tuple[Processor, Processor]:
    metrics = FrontendMetrics()
    return (
        await create_processor("stator", card, metrics),
        await create_processor("vllm", card, metrics),
    )


# The echo model's template: the prompt is the last message's text, nothing else, so a
# mocker worker in echo mode answers exactly what the user wrote (reasoning, tool calls
# and the EOS that ends them included).
ECHO_TEMPLATE = "{{ messages[-1]['content'] }}"


def echo_model(path: Path) -> Path:
    model_dir = make_model_dir(path, chat_template=ECHO_TEMPLATE)
    add_tokens(model_dir, MARKER_TOKENS)
    return model_dir


def tools_model_with_weights(path: Path) -> Path:
    """`tools_model` with random weights (a tiny Llama), for a real vLLM worker."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.engines.vllm.models import HIDDEN

    model_dir = make_model_dir(
        path,
        chat_template=PARITY_TOOLS_TEMPLATE,
        hidden_size=HIDDEN,
        num_heads=2,
        num_kv_heads=1,
        num_layers=2,
    )
    add_tokens(model_dir, MARKER_TOKENS)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir)).save_pretrained(
        model_dir
    )
    return model_dir
