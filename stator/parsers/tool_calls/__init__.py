"""Tool-call parsers by name (`--tool-call-parser`) and `tool_choice` checks."""

from stator.parsers.tool_calls import harmony, json_formats, qwen3_coder, whole_output
from stator.parsers.tool_calls.base import (
    ToolCall,
    ToolCallDelta,
    ToolCallParser,
    ToolDelta,
    assemble_calls,
    get_tool_call_parser,
    tool_call_parser_names,
)
from stator.parsers.tool_calls.choice import ToolChoiceError, validate_tool_choice

del harmony, json_formats, qwen3_coder, whole_output

__all__ = [
    "ToolCall",
    "ToolCallDelta",
    "ToolCallParser",
    "ToolChoiceError",
    "ToolDelta",
    "assemble_calls",
    "get_tool_call_parser",
    "tool_call_parser_names",
    "validate_tool_choice",
]
