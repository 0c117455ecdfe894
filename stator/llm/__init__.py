"""LLM pre- and postprocessing: tokenizer, chat template, sampling mapping, incremental
detokenization, stop strings. Pure and synchronous; the frontend wraps it."""

from stator.llm.chat_template import ChatTemplate, TemplateRenderError
from stator.llm.detokenizer import IncrementalDetokenizer
from stator.llm.model_files import ModelFiles
from stator.llm.tokenizer import Tokenizer, TokenizerError

__all__ = [
    "ChatTemplate",
    "IncrementalDetokenizer",
    "ModelFiles",
    "TemplateRenderError",
    "Tokenizer",
    "TokenizerError",
]
