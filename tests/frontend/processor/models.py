"""Model directories (config and tokenizer files, no weights: processors read nothing
else) for the processor parity tests, and both processors built over one card."""

from __future__ import annotations

import json
from pathlib import Path

from stator.frontend.metrics import FrontendMetrics
from stator.frontend.processor import Processor, create_processor
from stator.protocols import ModelCard
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


# o200k_harmony's special tokens that GPT-OSS's own files name.
HARMONY_BOS, HARMONY_PAD, HARMONY_RETURN, HARMONY_CALL = 199998, 199999, 200002, 200012


def harmony_model(path: Path, tokenizer_json: Path) -> Path:
    """GPT-OSS's files on the real o200k_harmony vocabulary."""
    model_dir = make_model_dir(
        path, chat_template=None, architecture="GptOssForCausalLM", model_type="gpt_oss"
    )
    (model_dir / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    specials = {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"}  # fmt: skip
    tok_config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 131072}
    (model_dir / "tokenizer_config.json").write_text(json.dumps({**tok_config, **specials}))
    (model_dir / "special_tokens_map.json").write_text(json.dumps(specials))
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    config.update(
        vocab_size=201088,
        bos_token_id=HARMONY_BOS,
        eos_token_id=HARMONY_RETURN,
        pad_token_id=HARMONY_PAD,
        num_local_experts=4,
        num_experts_per_tok=2,
        experts_per_token=2,
        intermediate_size=64,
        sliding_window=128,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=131072,
    )
    config_path.write_text(json.dumps(config))
    eos = [HARMONY_RETURN, HARMONY_PAD, HARMONY_CALL]
    (model_dir / "generation_config.json").write_text(
        json.dumps({"bos_token_id": HARMONY_BOS, "eos_token_id": eos, "pad_token_id": HARMONY_PAD})
    )
    return model_dir


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
