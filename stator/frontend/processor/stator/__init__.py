"""stator's own processor: its chat templates, tokenizer, detokenizer, stop strings and
parsers (`stator.llm`, `stator.parsers`)."""

from stator.frontend.processor.stator.parsing import ModelParsing
from stator.frontend.processor.stator.processor import StatorProcessor

__all__ = ["ModelParsing", "StatorProcessor"]
