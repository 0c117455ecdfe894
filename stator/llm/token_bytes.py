"""Raw bytes of vocabulary pieces: what logprobs report as `bytes`, and what lets a
byte-level BPE stream be decoded with a UTF-8 incremental decoder instead of the
tokenizer's decoder (see `IncrementalDetokenizer`)."""

from __future__ import annotations

import json
from collections.abc import Callable

import tokenizers


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE writes each byte as one printable character: printable
    Latin-1 bytes stand for themselves, the others are shifted to U+0100 and up."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(0x100 + shifted)
            shifted += 1
    return {c: b for b, c in chars.items()}


_BYTE_LEVEL = _byte_level_alphabet()


def _decoder_types(inner: tokenizers.Tokenizer) -> set[str]:
    if inner.decoder is None:
        return set()
    try:
        spec = json.loads(inner.decoder.__getstate__())
    except Exception:
        return set()
    parts = spec.get("decoders", [spec]) if isinstance(spec, dict) else []
    return {p.get("type") for p in parts if isinstance(p, dict)}


def token_bytes_reader(inner: tokenizers.Tokenizer) -> Callable[[str], bytes | None]:
    """How to read a vocabulary piece's raw bytes for this tokenizer's decoder (None:
    not knowable from the piece; the caller falls back to the decoded text)."""
    kinds = _decoder_types(inner)
    if "ByteLevel" in kinds:

        def byte_level(piece: str) -> bytes | None:
            try:
                return bytes(_BYTE_LEVEL[c] for c in piece)
            except KeyError:
                return None

        return byte_level
    if "ByteFallback" in kinds:

        def byte_fallback(piece: str) -> bytes | None:
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                try:
                    return bytes([int(piece[3:5], 16)])
                except ValueError:
                    return None
            return piece.replace("\u2581", " ").encode()

        return byte_fallback
    return lambda piece: None


def byte_level_table(inner: tokenizers.Tokenizer) -> list[bytes] | None:
    """Every id's bytes, when decoding is nothing but byte-level BPE: then decoding a
    sequence is exactly "concatenate the bytes, decode UTF-8 with replacement". Pieces
    outside the byte alphabet (added tokens like "<｜end▁of▁sentence｜>") contribute their
    characters' UTF-8, as the ByteLevel decoder does."""
    if _decoder_types(inner) != {"ByteLevel"}:
        return None
    vocab = inner.get_vocab(with_added_tokens=True)
    table = [b""] * (max(vocab.values(), default=-1) + 1)
    alphabet = _BYTE_LEVEL
    for piece, token_id in vocab.items():
        table[token_id] = b"".join(
            bytes((alphabet[c],)) if c in alphabet else c.encode() for c in piece
        )
    return table
