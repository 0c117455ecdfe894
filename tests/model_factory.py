"""Tiny model directories built on the fly for tests (nothing can be downloaded here).

`make_model_dir` trains a small byte-level BPE tokenizer (about a second) and writes the
files a Hugging Face model directory has: `tokenizer.json`, `tokenizer_config.json` (with
a chat template), `config.json` (a tiny Llama), `generation_config.json`. No weights: the
native-engine tests add random weights with transformers' `from_config`.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]


def training_text(max_chars: int = 400_000) -> list[str]:
    """Text to train on: CPython's own standard-library sources (always present)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(errors="ignore")
        out.append(text)
        total += len(text)
        if total >= max_chars:
            break
    return out


def train_tokenizer(vocab_size: int = 2000, texts: list[str] | None = None) -> Tokenizer:
    """A byte-level BPE tokenizer trained on `texts` (default: `training_text()`)."""
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_text() if texts is None else texts, trainer)
    return tok


_cached_tokenizer: str | None = None


def tokenizer_json(vocab_size: int = 2000) -> str:
    global _cached_tokenizer
    if _cached_tokenizer is None:
        _cached_tokenizer = train_tokenizer(vocab_size).to_str()
    return _cached_tokenizer


def make_model_dir(
    path: str | Path,
    *,
    chat_template: str | None = CHATML_TEMPLATE,
    max_position_embeddings: int = 2048,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    architecture: str = "LlamaForCausalLM",
    model_type: str = "llama",
) -> Path:
    """Write a tiny model directory (tokenizer + config, no weights) and return it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    text = tokenizer_json()
    (path / "tokenizer.json").write_text(text)
    vocab_size = Tokenizer.from_str(text).get_vocab_size()
    tok_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "<|im_end|>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "model_max_length": max_position_embeddings,
        "add_bos_token": False,
    }
    if chat_template is not None:
        tok_config["chat_template"] = chat_template
    (path / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2))
    (path / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "<|im_end|>", "unk_token": "<unk>"})
    )
    eos_id = SPECIAL_TOKENS.index("<|im_end|>")
    config = {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": hidden_size * 2,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": hidden_size // num_heads,
        "max_position_embeddings": max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": SPECIAL_TOKENS.index("<s>"),
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
    }
    (path / "config.json").write_text(json.dumps(config, indent=2))
    (path / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": eos_id, "temperature": 0.7})
    )
    return path
