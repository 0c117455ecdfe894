"""Qwen3-Coder's XML-like calls:

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Tokyo
    </parameter>
    </function>
    </tool_call>

Parameter values are raw text; the tool's JSON schema says which ones are numbers, booleans,
objects or arrays (then the text is parsed as JSON, or as a Python literal as a fallback).
"""

from __future__ import annotations

import ast
import json
import re

from stator.parsers.tool_calls.base import register_tool_call_parser
from stator.parsers.tool_calls.streaming import MalformedToolCall, ParsedCalls, RegionToolParser

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)


class Qwen3CoderToolParser(RegionToolParser):
    start_markers = ("<tool_call>",)
    end_marker = "</tool_call>"
    all_markers = ("</function>", "</parameter>")

    def parse_region(self, start_marker: str, body: str, *, complete: bool) -> ParsedCalls:
        calls: ParsedCalls = []
        for match in _FUNCTION.finditer(body):
            name = match.group(1).strip()
            if not complete and "</function>" not in match.group(0):
                raise MalformedToolCall("truncated <function>")
            schema = self._parameter_schemas(name)
            arguments = {
                key.strip(): _typed_value(_strip_one_newline(value), schema.get(key.strip()))
                for key, value in _PARAMETER.findall(match.group(2))
            }
            calls.append((name, arguments))
        if not calls:
            raise MalformedToolCall("<tool_call> without <function=...>")
        return calls

    def _strip_markers(self, text: str) -> str:
        text = re.sub(r"</?(?:function|parameter)(?:=[^>\n]*)?>", "", text)
        return super()._strip_markers(text)

    def _parameter_schemas(self, name: str) -> dict:
        for tool in self.tools:
            function = tool.get("function", tool)
            if function.get("name") == name:
                return (function.get("parameters") or {}).get("properties") or {}
        return {}


def _strip_one_newline(value: str) -> str:
    value = value.removeprefix("\n")
    return value.removesuffix("\n")


def _typed_value(text: str, schema: dict | None) -> object:
    kind = (schema or {}).get("type", "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if text.strip() == "null" and kind != "string":
        return None
    if kind == "string":
        return text
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        try:
            value = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            return text
    if kind in ("integer", "number") and isinstance(value, bool):
        return text
    return value


register_tool_call_parser("qwen3_coder")(Qwen3CoderToolParser)
