"""`--speculative-config`: vLLM's JSON shape, e.g.

    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}
    {"method": "draft_model", "model": "/models/llama-3.2-1b", "num_speculative_tokens": 4}
    {"method": "eagle3", "model": "/models/eagle3-llama3.1-8b", "num_speculative_tokens": 3}

Without `method`, a `model` means a draft model (vLLM infers EAGLE from the name; we ask for
the method instead). Unknown keys are refused, so a typo is not silently ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

METHODS = ("ngram", "draft_model", "eagle3")
_ALIASES = {"[ngram]": "ngram", "draft": "draft_model", "eagle-3": "eagle3", "eagle": "eagle3"}
# vLLM keys we accept and do not need (one GPU, one draft rank).
_IGNORED = {"draft_tensor_parallel_size", "disable_by_batch_size", "quantization"}


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    model: str | None = None
    # n-gram prompt lookup: the longest suffix of length max..min found earlier wins.
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 2

    @classmethod
    def parse(cls, value: str | dict[str, Any] | None) -> SpeculativeConfig | None:
        """None for an empty value. Raises ValueError naming what is wrong."""
        if value is None or value == "" or value == {}:
            return None
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise ValueError(f"--speculative-config is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError("--speculative-config must be a JSON object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known - _IGNORED)
        if unknown:
            raise ValueError(
                f"--speculative-config: unknown keys {unknown}; known: {sorted(known)}"
            )
        values = {k: v for k, v in value.items() if k in known}
        method = values.get("method")
        if method is None:
            method = "draft_model" if values.get("model") else None
        method = _ALIASES.get(method, method)
        if method not in METHODS:
            raise ValueError(
                f"--speculative-config: method must be one of {', '.join(METHODS)}; got {method!r}"
            )
        values["method"] = method
        k = values.get("num_speculative_tokens")
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 16:
            raise ValueError("--speculative-config: num_speculative_tokens must be 1..16")
        if method != "ngram" and not values.get("model"):
            raise ValueError(f"--speculative-config: method {method} needs a model directory")
        config = cls(**values)
        if not 1 <= config.prompt_lookup_min <= config.prompt_lookup_max:
            raise ValueError(
                "--speculative-config: need 1 <= prompt_lookup_min <= prompt_lookup_max"
            )
        return config


#: Verification steps run as CUDA graphs up to this many sequences: speculation pays at
#: small batches, and every batch bucket costs a capture and its logits buffer.
MAX_VERIFY_BATCH = 32


def verify_tokens(value: str | dict[str, Any] | None) -> int:
    """Tokens per sequence of a full verification step (the last real token and k drafts)
    for the verify CUDA graphs, or 0 for none: no speculation, or EAGLE-3 (its head reads
    target hidden states that the graphs do not return)."""
    config = SpeculativeConfig.parse(value)
    if config is None or config.method == "eagle3":
        return 0
    return 1 + config.num_speculative_tokens
