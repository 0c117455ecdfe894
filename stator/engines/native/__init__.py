"""stator's own engine: PyTorch, paged KV cache, continuous batching, prefix caching.

`create_engine(config, model_path, served_name)` builds the `Engine` the worker host
serves; `stator.LLM` is the offline API over the same core. Importing this package does
not import torch (flag parsing stays fast); creating an engine does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stator.engines.native.config import NativeConfig

if TYPE_CHECKING:
    from stator.engines.native.core_client import CoreProcessEngine
    from stator.engines.native.engine import NativeEngine


def create_engine(
    config: NativeConfig, model_path: str, served_name: str
) -> NativeEngine | CoreProcessEngine:
    """The native engine for the model directory `model_path` (weights load in `start()`):
    its core in a process of its own (`--engine-core-process`), or in this one."""
    if uses_core_process(config):
        from stator.engines.native.core_client import CoreProcessEngine

        return CoreProcessEngine(config, model_path, served_name)
    from stator.engines.native.engine import NativeEngine

    return NativeEngine(config, model_path, served_name)


def uses_core_process(config: NativeConfig) -> bool:
    if config.engine_core_process != "auto":
        return config.engine_core_process == "on"
    if config.device == "cpu":
        return False
    import torch

    return torch.cuda.is_available()


__all__ = ["NativeConfig", "create_engine", "uses_core_process"]
