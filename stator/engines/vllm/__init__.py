"""vLLM backend: stator's Engine on vLLM's `AsyncLLM` (needs `vllm` installed)."""

from __future__ import annotations

import vllm  # noqa: F401  (fail the import here, so the registry says vLLM is missing)

from stator.engines.vllm.config import VllmConfig


def create_engine(config: VllmConfig | None, model_path: str, served_name: str):
    from stator.engines.vllm.engine import VllmEngine

    return VllmEngine(config or VllmConfig(), model_path, served_name)


__all__ = ["VllmConfig", "create_engine"]
