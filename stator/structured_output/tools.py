"""A forced `tool_choice` as a JSON schema, and the calls read back from the output.

`tool_choice: {"type": "function", "function": {"name": N}}` constrains the whole output to
N's `parameters` schema: the output *is* the arguments object. `tool_choice: "required"`
constrains it to a non-empty JSON array of `{"name": ..., "parameters": {...}}`, one entry
per call, each name one of the tools and its parameters that tool's schema (vLLM's shape,
so clients see the same calls from either server). The model's own call syntax (Hermes
tags, Harmony, ...) is not used: the schema makes the call parser-independent.
"""

from __future__ import annotations

import json
from typing import Any

_ANY_OBJECT: dict[str, Any] = {"type": "object"}


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    return tool.get("function") or tool


def _parameters(tool: dict[str, Any]) -> dict[str, Any]:
    params = _function(tool).get("parameters")
    return params if isinstance(params, dict) and params else dict(_ANY_OBJECT)


def forced_name(tool_choice: Any) -> str | None:
    if isinstance(tool_choice, dict):
        function = tool_choice.get("function") or {}
        return function.get("name") or tool_choice.get("name")
    return None


def is_forced(tool_choice: Any) -> bool:
    return tool_choice == "required" or forced_name(tool_choice) is not None


def forced_tool_schema(tools: list[dict[str, Any]] | None, tool_choice: Any) -> dict | None:
    """The schema the output must follow, or None when the tool choice forces no call."""
    if not tools or not is_forced(tool_choice):
        return None
    name = forced_name(tool_choice)
    if name is not None:
        for tool in tools:
            if _function(tool).get("name") == name:
                return _parameters(tool)
        return None  # the frontend answers 400 for an unknown name first
    entries = []
    for tool in tools:
        entries.append(
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [_function(tool).get("name")]},
                    "parameters": _parameters(tool),
                },
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
        )
    items = entries[0] if len(entries) == 1 else {"anyOf": entries}
    return {"type": "array", "minItems": 1, "items": items}


def parse_forced_calls(text: str, tool_choice: Any) -> list[tuple[str, str]]:
    """(name, arguments JSON) of each call in an output made under `forced_tool_schema`.
    Raises ValueError when the text is not such an output (cut off by max_tokens)."""
    value = json.loads(text)
    name = forced_name(tool_choice)
    if name is not None:
        if not isinstance(value, dict):
            raise ValueError("the arguments are not a JSON object")
        return [(name, json.dumps(value, ensure_ascii=False))]
    if not isinstance(value, list) or not value:
        raise ValueError("the output is not a non-empty list of calls")
    calls = []
    for entry in value:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ValueError("a call has no name")
        arguments = entry.get("parameters", {})
        if not isinstance(arguments, dict):
            raise ValueError("a call's parameters are not a JSON object")
        calls.append((entry["name"], json.dumps(arguments, ensure_ascii=False)))
    return calls
