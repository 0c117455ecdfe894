"""stator's own engine: PyTorch, paged KV cache, continuous batching, prefix caching.

`create_engine(config, model_path, served_name)` builds the `Engine` the worker host
serves; `stator.LLM` is the offline API over the same core. Importing this package does
not import torch (flag parsing stays fast); creating an engine does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stator.engines.native.config import NativeConfig

if TYPE_CHECKING:
    from stator.engines.native.engine import NativeEngine


def create_engine(config: NativeConfig, model_path: str, served_name: str) -> NativeEngine:
    """The native engine for the model directory `model_path` (weights load in `start()`)."""
    from stator.engines.native.engine import NativeEngine

    return NativeEngine(config, model_path, served_name)


__all__ = ["NativeConfig", "create_engine"]
