"""Grammars bound to one model's vocabulary: compiled once per spec, copied per request,
and many requests' token bitmasks filled in parallel (llguidance's thread pool).

A bitmask row is `ceil(vocab / 32)` int32 words; bit j of word i allows token 32 * i + j.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any

from stator.protocols import GuidedDecoding
from stator.structured_output.grammar import (
    InvalidGrammar,
    available,
    grammar_text,
    spec_key,
    spec_param,
)

log = logging.getLogger(__name__)

#: Compiled grammars kept per engine; agents reuse a handful of schemas.
CACHE_SIZE = 256


def mask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


class GrammarCompiler:
    """Compiles `GuidedDecoding` specs for one vocabulary; `matcher(spec)` gives a fresh
    per-request matcher (a copy of the cached compiled one)."""

    def __init__(
        self,
        tokenizer_json: str,
        vocab_size: int,
        eos_token_ids: list[int],
        *,
        threads: int | None = None,
        cache_size: int = CACHE_SIZE,
    ) -> None:
        import llguidance

        self.vocab_size = vocab_size
        self.words = mask_words(vocab_size)
        eos: Any = list(eos_token_ids) or None
        try:
            self.tokenizer = llguidance.LLTokenizer(
                tokenizer_json, n_vocab=vocab_size, eos_token=eos
            )
        except ValueError:  # an EOS id outside the tokenizer: its own EOS then
            self.tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size)
        self.executor = llguidance.LLExecutor(threads)
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._cache_size = cache_size
        self.hits = 0
        self.misses = 0

    @classmethod
    def for_model(
        cls,
        model_dir: str | Path,
        vocab_size: int,
        eos_token_ids: list[int],
        threads: int | None = None,
    ) -> GrammarCompiler | None:
        """None when the library is missing or the model has no `tokenizer.json`."""
        path = Path(model_dir) / "tokenizer.json"
        if not available() or not path.is_file():
            return None
        try:
            return cls(path.read_text(), vocab_size, eos_token_ids, threads=threads)
        except Exception:  # an unusual tokenizer: serve without structured output
            log.exception("structured output is off: llguidance cannot read %s", path)
            return None

    def matcher(self, spec: GuidedDecoding) -> Any:
        """A fresh `llguidance.LLMatcher` for `spec`. Raises `InvalidGrammar`."""
        import llguidance

        key = spec_key(spec)
        template = self._cache.get(key)
        if template is None:
            self.misses += 1
            template = llguidance.LLMatcher(self.tokenizer, grammar_text(spec), log_level=0)
            if template.is_error():
                param = spec_param(spec)
                raise InvalidGrammar(
                    f"{param}: the constraint cannot be compiled: {template.get_error()}", param
                )
            self._cache[key] = template
            if len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        else:
            self.hits += 1
            self._cache.move_to_end(key)
        return template.deep_copy()

    def fill(self, rows: list[tuple[Any, int]], buffer_ptr: int, num_rows: int) -> None:
        """Compute each (matcher, row)'s next-token bitmask into row `row` of an int32
        buffer of `num_rows` x `words` at `buffer_ptr`, in parallel."""
        if rows:
            self.executor.unsafe_compute_mask_ptr(rows, buffer_ptr, self.words * 4, num_rows)
