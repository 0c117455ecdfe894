"""Reasoning and tool-call parsing of model output, and GPT-OSS Harmony. Pure and synchronous."""

from stator.parsers.output import OutputParser, ParsedDelta
from stator.parsers.reasoning import ReasoningDelta, get_reasoning_parser
from stator.parsers.tool_calls import ToolCall, ToolCallDelta, ToolDelta, get_tool_call_parser

__all__ = [
    "OutputParser",
    "ParsedDelta",
    "ReasoningDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolDelta",
    "get_reasoning_parser",
    "get_tool_call_parser",
]
