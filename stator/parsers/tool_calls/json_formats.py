"""Formats whose calls are JSON objects between markers: Hermes, Mistral, DeepSeek-V3."""

from __future__ import annotations

import json

from stator.parsers.tool_calls.base import register_tool_call_parser
from stator.parsers.tool_calls.streaming import MalformedToolCall, ParsedCalls, RegionToolParser


def json_values(text: str) -> list[object]:
    """Every JSON value in `text`, back to back (separated by whitespace, `,` or `;`)."""
    decoder = json.JSONDecoder()
    values, pos = [], 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,;":
            pos += 1
        if pos == len(text):
            return values
        try:
            value, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise MalformedToolCall(str(exc)) from exc
        values.append(value)


def name_and_arguments(
    obj: object, arguments_keys=("arguments", "parameters")
) -> tuple[str, object]:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise MalformedToolCall("a tool call must be an object with a string 'name'")
    for key in arguments_keys:
        if key in obj:
            return obj["name"], obj[key]
    return obj["name"], {}


class HermesToolParser(RegionToolParser):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number of them
    (Hermes 2 Pro, Qwen 2.5/3)."""

    start_markers = ("<tool_call>",)
    end_marker = "</tool_call>"

    def parse_region(self, start_marker: str, body: str, *, complete: bool) -> ParsedCalls:
        values = json_values(body)
        if not values:
            raise MalformedToolCall("empty <tool_call>")
        return [name_and_arguments(value) for value in values]


class MistralToolParser(RegionToolParser):
    """`[TOOL_CALLS]` then the rest of the output: a JSON array of calls (v3 tokenizers), or
    `name[ARGS]{...}` per call, each after its own `[TOOL_CALLS]` (v11+)."""

    start_markers = ("[TOOL_CALLS]",)
    end_marker = None
    all_markers = ("[ARGS]", "[CALL_ID]")

    def parse_region(self, start_marker: str, body: str, *, complete: bool) -> ParsedCalls:
        calls: ParsedCalls = []
        for piece in body.split("[TOOL_CALLS]"):
            piece = piece.strip()
            if not piece:
                continue
            if "[ARGS]" in piece:
                name, arguments = piece.split("[ARGS]", 1)
                name = name.split("[CALL_ID]", 1)[0].strip()
                values = json_values(arguments)
                if len(values) != 1 or not name:
                    raise MalformedToolCall("expected name[ARGS]{...}")
                calls.append((name, values[0]))
                continue
            for value in json_values(piece):
                items = value if isinstance(value, list) else [value]
                calls.extend(name_and_arguments(item) for item in items)
        if not calls:
            raise MalformedToolCall("[TOOL_CALLS] without calls")
        return calls


CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
TOOL_SEP = "<｜tool▁sep｜>"


class DeepSeekV3ToolParser(RegionToolParser):
    """DeepSeek-V3: `<｜tool▁calls▁begin｜>` then per call
    `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>`;
    V3.1 writes `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`."""

    start_markers = (CALLS_BEGIN,)
    end_marker = CALLS_END
    all_markers = (CALL_BEGIN, CALL_END, TOOL_SEP)

    def parse_region(self, start_marker: str, body: str, *, complete: bool) -> ParsedCalls:
        calls: ParsedCalls = []
        for piece in body.split(CALL_BEGIN)[1:]:
            if CALL_END not in piece:
                raise MalformedToolCall("call without end marker")
            piece = piece.split(CALL_END, 1)[0]
            if TOOL_SEP not in piece:
                raise MalformedToolCall("call without separator")
            head, rest = piece.split(TOOL_SEP, 1)
            if head.strip() == "function" and "\n" in rest:
                name, arguments = rest.split("\n", 1)
                arguments = arguments.strip()
                if arguments.startswith("```"):
                    arguments = arguments.removeprefix("```json").removeprefix("```")
                    arguments = arguments.removesuffix("```")
            else:
                name, arguments = head, rest
            values = json_values(arguments)
            if len(values) != 1:
                raise MalformedToolCall("expected one JSON object of arguments")
            calls.append((name.strip(), values[0]))
        if not calls:
            raise MalformedToolCall("tool-call block without calls")
        return calls


register_tool_call_parser("hermes")(HermesToolParser)
register_tool_call_parser("mistral")(MistralToolParser)
register_tool_call_parser("deepseek_v3")(DeepSeekV3ToolParser)
