"""A Llama-2 / Mistral style tokenizer for tests: Metaspace ("▁") pre-tokenization, BPE with
byte fallback (<0xE4> tokens for characters outside the vocab) and a decoder chain that
strips the first leading space. Trained on the fly from the standard library's sources."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from tests.model_factory import training_text

SPECIALS = ["<unk>", "<s>", "</s>"]

_cached: str | None = None


def byte_fallback_tokenizer_json() -> str:
    global _cached
    if _cached is not None:
        return _cached
    trainer = trainers.BpeTrainer(
        vocab_size=1500, special_tokens=SPECIALS, limit_alphabet=100, show_progress=False
    )
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.train_from_iterator(training_text(200_000), trainer)
    # Rebuild the model with the 256 byte tokens in its vocabulary and byte fallback on.
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = dict(model["vocab"])
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    bpe = models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True)
    out = Tokenizer(bpe)
    out.add_special_tokens(SPECIALS)
    out.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    out.pre_tokenizer = None
    out.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(content=" ", left=1, right=0),
        ]
    )
    _cached = out.to_str()
    return _cached


def make_byte_fallback_dir(path: str | Path) -> Path:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.json").write_text(byte_fallback_tokenizer_json())
    (path / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})
    )
    return path
