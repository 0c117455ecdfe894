"""LLM pre- and postprocessing: tokenizer, chat template, sampling mapping, incremental
detokenization, stop strings. Pure and synchronous; the frontend wraps it."""

from stator.llm.chat_template import ChatTemplate, TemplateRenderError
from stator.llm.detokenizer import IncrementalDetokenizer
from stator.llm.model_files import ModelFiles
from stator.llm.postprocess import ChoiceProcessor, Delta, LogprobEntry, TopLogprobEntry
from stator.llm.sampling import SamplingPlan, build_sampling
from stator.llm.stop_strings import StopStringMatcher
from stator.llm.tokenizer import Tokenizer, TokenizerError
from stator.llm.validate import InvalidParam

__all__ = [
    "ChatTemplate",
    "ChoiceProcessor",
    "Delta",
    "IncrementalDetokenizer",
    "InvalidParam",
    "LogprobEntry",
    "ModelFiles",
    "SamplingPlan",
    "StopStringMatcher",
    "TemplateRenderError",
    "Tokenizer",
    "TokenizerError",
    "TopLogprobEntry",
    "build_sampling",
]
