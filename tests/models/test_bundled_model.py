"""The model `stator run` serves by default: complete, small, and its output looks like text."""

import json
import re

import jinja2
import pytest
from tokenizers import Tokenizer

from stator.models import TINY_CHAT, bundled_model_dir

FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "model.safetensors",
)


def test_the_bundled_model_is_complete_and_small():
    assert bundled_model_dir() == TINY_CHAT
    for name in FILES:
        assert (TINY_CHAT / name).is_file(), name
    size = sum(p.stat().st_size for p in TINY_CHAT.iterdir())
    assert size < 8 * 1024 * 1024
    config = json.loads((TINY_CHAT / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    tokenizer = Tokenizer.from_file(str(TINY_CHAT / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == config["vocab_size"]
    assert tokenizer.token_to_id("<|im_end|>") == config["eos_token_id"]


def test_the_chat_template_is_chatml():
    tok_config = json.loads((TINY_CHAT / "tokenizer_config.json").read_text())
    template = jinja2.Environment().from_string(tok_config["chat_template"])
    text = template.render(messages=[{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_an_unknown_bundled_model_is_a_clear_error():
    with pytest.raises(FileNotFoundError, match="no bundled model"):
        bundled_model_dir("nope")


def test_transformers_generates_text_like_output():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(TINY_CHAT)
    model = transformers.AutoModelForCausalLM.from_pretrained(TINY_CHAT, dtype=torch.float32)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "And God said, Let there be light."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    out = model.generate(ids, max_new_tokens=40, do_sample=False)
    text = tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    words = re.findall(r"[A-Za-z]+", text)
    # English-looking: several words, mostly made of letters and spaces.
    assert len(words) >= 5, text
    letters = sum(c.isalpha() or c.isspace() for c in text)
    assert letters / max(1, len(text)) > 0.8, text
    common = {"the", "and", "of", "to", "unto", "that", "he", "in", "shall", "his", "i"}
    assert any(w.lower() in common for w in words), text
