"""The processor seam (`base.Processor`) and its implementations: `stator` (ours) and
`vllm` (vLLM's own classes). `create_processor` builds the one a frontend was told to use."""

from __future__ import annotations

from stator.frontend.metrics import FrontendMetrics
from stator.frontend.processor.base import (
    PROCESSORS,
    ChoiceParser,
    ChoicePlan,
    OutputProcessor,
    PreparedRequest,
    Processor,
    Prompt,
    prompt_length,
)
from stator.protocols import ModelCard


async def create_processor(kind: str, card: ModelCard, metrics: FrontendMetrics) -> Processor:
    """The `kind` processor ("stator" or "vllm") of the model of `card`; raises
    `VllmUnavailable` for "vllm" where vLLM is not installed."""
    if kind == "vllm":
        from stator.frontend.processor.vllm.processor import VllmProcessor

        return await VllmProcessor.create(card, metrics)
    if kind != "stator":
        raise ValueError(f"unknown processor {kind!r}; known: {', '.join(PROCESSORS)}")
    from stator.frontend.processor.stator import StatorProcessor

    return await StatorProcessor.create(card, metrics)


__all__ = [
    "PROCESSORS",
    "ChoiceParser",
    "ChoicePlan",
    "OutputProcessor",
    "PreparedRequest",
    "Processor",
    "Prompt",
    "create_processor",
    "prompt_length",
]
