"""Reasoning parsers by name (`--reasoning-parser`)."""

from stator.parsers.reasoning import gpt_oss, think_tags
from stator.parsers.reasoning.base import (
    ReasoningDelta,
    ReasoningParser,
    get_reasoning_parser,
    parse_reasoning,
    reasoning_parser_names,
)

del gpt_oss, think_tags

__all__ = [
    "ReasoningDelta",
    "ReasoningParser",
    "get_reasoning_parser",
    "parse_reasoning",
    "reasoning_parser_names",
]
