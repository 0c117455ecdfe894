"""The processor seam (`base.Processor`) and its implementations: `stator` (ours) and
`vllm` (vLLM's own classes). `create_processor` builds the one a frontend was told to use."""

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

__all__ = [
    "PROCESSORS",
    "ChoiceParser",
    "ChoicePlan",
    "OutputProcessor",
    "PreparedRequest",
    "Processor",
    "Prompt",
    "prompt_length",
]
