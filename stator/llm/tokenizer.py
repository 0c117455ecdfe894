"""`Tokenizer`: a Hugging Face `tokenizers.Tokenizer` plus the facts a server needs from
the model directory around it (special tokens, EOS ids).

Files are read from a directory or from an in-memory `{name: bytes}` map (a `ModelCard`
may carry them inline when the frontend cannot see the worker's disk).
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tokenizers

from stator.llm.token_bytes import byte_level_table, token_bytes_reader

# The files a tokenizer may need, in the order they are consulted.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "config.json",
    "chat_template.jinja",
    "chat_template.json",
)


# Texts at least this long are tokenized in a thread. Encoding holds the event loop for
# about 0.75 ms per 1k tokens here, so a 10k-token prompt encoded on the loop stalls every
# stream for ~8 ms; in a thread it does not (`encode_batch_fast` releases the GIL). Shorter
# texts stay inline: a thread hop costs 0.1-0.5 ms on a busy box, more than encoding them.
OFF_LOOP_CHARS = 8192


class TokenizerError(Exception):
    """The model files do not describe a usable tokenizer."""


def read_model_files(path: str | Path) -> dict[str, bytes]:
    """The tokenizer-related files present in a model directory, as `{name: bytes}`."""
    path = Path(path)
    if not path.is_dir():
        raise TokenizerError(f"model directory not found: {path}")
    return {name: (path / name).read_bytes() for name in TOKENIZER_FILES if (path / name).is_file()}


def load_json(files: Mapping[str, bytes], name: str) -> dict[str, Any]:
    """A JSON file from `files` as a dict ({} when absent)."""
    raw = files.get(name)
    if raw is None:
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{name} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise TokenizerError(f"{name} must hold a JSON object")
    return data


def token_content(value: Any) -> str | None:
    """A special token as tokenizer_config writes it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _as_id_list(value: Any) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


class Tokenizer:
    """Encode and decode text for one model."""

    def __init__(
        self,
        inner: tokenizers.Tokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        special_tokens_map: dict[str, str] | None = None,
        eos_token_ids: list[int] | None = None,
        model_max_length: int | None = None,
    ) -> None:
        self.inner = inner
        self.bos_token = bos_token
        self.eos_token = eos_token
        # What HF passes to chat templates: bos_token, eos_token, unk_token, pad_token, ...
        self.special_tokens_map = dict(special_tokens_map or {})
        self.model_max_length = model_max_length
        added = inner.get_added_tokens_decoder()
        # Exactly the ids `decode(skip_special_tokens=True)` drops (tokenizers' rule).
        self.special_ids: frozenset[int] = frozenset(i for i, tok in added.items() if tok.special)
        self.vocab_size: int = inner.get_vocab_size(with_added_tokens=True)
        ids = list(eos_token_ids or [])
        if not ids and eos_token is not None:
            eos_id = inner.token_to_id(eos_token)
            if eos_id is not None:
                ids.append(eos_id)
        self.eos_token_ids: list[int] = list(dict.fromkeys(ids))
        self._added_ids: frozenset[int] = frozenset(added)
        self._raw_bytes = token_bytes_reader(inner)
        self._token_info: dict[int, tuple[str, list[int]]] = {}
        self._byte_table: list[bytes] | None = None
        self._byte_table_built = False

    # -- construction ----------------------------------------------------------------------

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        return cls.from_files(read_model_files(path))

    @classmethod
    def from_files(cls, files: Mapping[str, bytes]) -> Tokenizer:
        raw = files.get("tokenizer.json")
        if raw is None:
            raise TokenizerError("tokenizer.json is missing (only fast tokenizers are supported)")
        try:
            inner = tokenizers.Tokenizer.from_str(
                raw.decode() if isinstance(raw, bytes) else str(raw)
            )
        except Exception as e:
            raise TokenizerError(f"tokenizer.json cannot be loaded: {e}") from e

        config = load_json(files, "tokenizer_config.json")
        special_map = load_json(files, "special_tokens_map.json")
        tokens: dict[str, str] = {}
        for key in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token"):
            value = token_content(config.get(key)) or token_content(special_map.get(key))
            if value is not None:
                tokens[key] = value

        # EOS ids, in order of authority: the tokenizer's EOS, then generation_config's
        # (often a list: Llama 3 stops on <|eot_id|> and <|end_of_text|>), then config.json's.
        eos_ids: list[int] = []
        if "eos_token" in tokens:
            eos_id = inner.token_to_id(tokens["eos_token"])
            if eos_id is not None:
                eos_ids.append(eos_id)
        eos_ids += _as_id_list(load_json(files, "generation_config.json").get("eos_token_id"))
        eos_ids += _as_id_list(load_json(files, "config.json").get("eos_token_id"))

        max_len = config.get("model_max_length")
        # HF writes a huge sentinel (1e30) when the length is unknown.
        if not isinstance(max_len, int) or max_len <= 0 or max_len >= 10**12:
            max_len = None
        return cls(
            inner,
            bos_token=tokens.get("bos_token"),
            eos_token=tokens.get("eos_token"),
            special_tokens_map=tokens,
            eos_token_ids=eos_ids,
            model_max_length=max_len,
        )

    # -- use -------------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """The ids of `text`. `encode_batch_fast` runs the same pipeline as `encode`
        (normalizer, added tokens, pre-tokenizer, model, post-processor) but does not track
        character offsets, which we never use: the same ids, 20-35% sooner for a
        512-token prompt (benchmarks/README.md, "Frontend, session 3")."""
        (encoding,) = self.inner.encode_batch_fast([text], add_special_tokens=add_special_tokens)
        return encoding.ids

    async def encode_async(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """`encode`, off the event loop (and off the GIL) for long texts."""
        if len(text) < OFF_LOOP_CHARS:
            return self.encode(text, add_special_tokens)
        return await asyncio.to_thread(self.encode, text, add_special_tokens)

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters one token's text spans (at least 1). A text longer than
        `context_length × max_token_chars` cannot fit the context, whatever its ids: the
        frontend refuses it before tokenizing (a 10 MB prompt took 1.15 GB to tokenize)."""
        vocab = self.inner.get_vocab(with_added_tokens=True)
        return max(map(len, vocab), default=1) or 1

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.inner.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.inner.id_to_token(token_id)

    def byte_level_table(self) -> list[bytes] | None:
        """Each id's raw bytes when the decoder is plain byte-level BPE (GPT-2, Llama 3,
        Qwen), else None. Built once (~0.1 s for a 150k vocabulary)."""
        if not self._byte_table_built:
            self._byte_table = byte_level_table(self.inner)
            self._byte_table_built = True
        return self._byte_table

    def token_info(self, token_id: int) -> tuple[str, list[int]]:
        """One token as logprobs show it: its text alone and its raw UTF-8 bytes (which
        may be part of a character: the text is then U+FFFD, the bytes are exact)."""
        info = self._token_info.get(token_id)
        if info is None:
            raw = None
            if token_id not in self._added_ids:
                piece = self.inner.id_to_token(token_id)
                raw = self._raw_bytes(piece) if piece is not None else None
            try:
                # From the bytes when they are whole characters: a decoder would strip
                # the leading space of "▁the" decoded alone.
                text = raw.decode() if raw is not None else None
            except UnicodeDecodeError:
                text = None
            if text is None:
                text = self.inner.decode([token_id], skip_special_tokens=False)
            info = (text, list(raw if raw is not None else text.encode()))
            self._token_info[token_id] = info
        return info

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, bos={self.bos_token!r}, "
            f"eos={self.eos_token!r}, eos_ids={self.eos_token_ids})"
        )
