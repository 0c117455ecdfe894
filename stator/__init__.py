"""stator: an OpenAI-compatible, KV-aware, distributed LLM serving system."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# The offline API, loaded on first use so that `import stator` does not import torch.
_LAZY = {
    "LLM": "stator.engines.native.llm",
    "SamplingParams": "stator.engines.native.sampling_params",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'stator' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["LLM", "SamplingParams", "__version__"]
