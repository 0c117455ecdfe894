"""Formats where the whole output is either tool calls or plain content: Llama 3 JSON and
pythonic lists. Whether it is calls shows in its first non-blank characters; when it is, the
output is held until the end (a call is never streamed and then taken back), and output that
does not parse after all is returned as content."""

from __future__ import annotations

import abc
import ast
import json
from collections.abc import Callable, Sequence

from stator.parsers.tool_calls.base import (
    ToolCall,
    ToolCallDelta,
    ToolDelta,
    assemble_calls,
    normalize_arguments,
    register_tool_call_parser,
)
from stator.parsers.tool_calls.json_formats import json_values, name_and_arguments
from stator.parsers.tool_calls.streaming import MalformedToolCall, ParsedCalls

_UNDECIDED, _CONTENT, _CALLS = "undecided", "content", "calls"


class WholeOutputToolParser(abc.ABC):
    # Prefixes that mark the output as calls; stripped from content if parsing fails.
    call_prefixes: Sequence[str] = ()
    marker_tokens: Sequence[str] = ()

    def __init__(self, *, tools: list[dict], id_factory: Callable[[], str]) -> None:
        self.tools = tools
        self._new_id = id_factory
        self._buffer = ""
        self._mode = _UNDECIDED

    @abc.abstractmethod
    def parse_calls(self, text: str) -> ParsedCalls: ...

    def feed(self, text_delta: str) -> ToolDelta:
        self._buffer += text_delta
        if self._mode == _UNDECIDED:
            head = self._buffer.lstrip()
            if any(head.startswith(prefix) for prefix in self.call_prefixes):
                self._mode = _CALLS
            elif not head or any(prefix.startswith(head) for prefix in self.call_prefixes):
                return ToolDelta()
            else:
                self._mode = _CONTENT
        if self._mode == _CALLS:
            return ToolDelta()
        out, self._buffer = ToolDelta(content=self._buffer), ""
        return out

    def finish(self) -> ToolDelta:
        text, self._buffer = self._buffer, ""
        if self._mode != _CALLS:
            return ToolDelta(content=text)
        try:
            parsed = [(name, normalize_arguments(args)) for name, args in self.parse_calls(text)]
        except (MalformedToolCall, ValueError, TypeError, SyntaxError):
            for token in self.marker_tokens:
                text = text.replace(token, "")
            return ToolDelta(content=text)
        out = ToolDelta()
        for index, (name, arguments) in enumerate(parsed):
            out.calls.append(ToolCallDelta(index, self._new_id(), name, ""))
            out.calls.append(ToolCallDelta(index, None, None, arguments))
        return out

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        delta = self.feed(text) + self.finish()
        return delta.content, assemble_calls(delta.calls)


PYTHON_TAG = "<|python_tag|>"


class Llama3JsonToolParser(WholeOutputToolParser):
    """Llama 3.1+/3.2 JSON tool calls: `{"name": "f", "parameters": {...}}`, several separated
    by `;`, optionally after `<|python_tag|>`."""

    call_prefixes = ("{", PYTHON_TAG)
    marker_tokens = (PYTHON_TAG,)

    def parse_calls(self, text: str) -> ParsedCalls:
        text = text.strip().removeprefix(PYTHON_TAG)
        values = json_values(text)
        if not values:
            raise MalformedToolCall("no JSON call")
        return [name_and_arguments(value) for value in values]


PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"


class PythonicToolParser(WholeOutputToolParser):
    """Python-call lists, as Llama 3.2/4 emit them: `[get_weather(city="SF"), ping()]`,
    optionally wrapped in `<|python_start|>…<|python_end|>`. Argument values are literals."""

    call_prefixes = ("[", PYTHON_START)
    marker_tokens = (PYTHON_START, PYTHON_END)

    def parse_calls(self, text: str) -> ParsedCalls:
        text = text.strip().removeprefix(PYTHON_START).removesuffix(PYTHON_END).strip()
        tree = ast.parse(text, mode="eval").body
        if not isinstance(tree, ast.List) or not tree.elts:
            raise MalformedToolCall("expected a non-empty list of calls")
        calls: ParsedCalls = []
        for node in tree.elts:
            if not isinstance(node, ast.Call) or node.args:
                raise MalformedToolCall("each element must be f(name=value, ...)")
            name = _dotted_name(node.func)
            arguments = {}
            for keyword in node.keywords:
                if keyword.arg is None:
                    raise MalformedToolCall("**kwargs are not allowed")
                arguments[keyword.arg] = _literal(keyword.value)
            calls.append((name, arguments))
        return calls


def _dotted_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted_name(node.value)}.{node.attr}"
    raise MalformedToolCall("call target must be a name")


def _literal(node: ast.expr) -> object:
    # JSON spellings are accepted too: models mix `true`/`null` into Python calls.
    if isinstance(node, ast.Name) and node.id in ("true", "false", "null"):
        return json.loads(node.id)
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True)}
    if isinstance(node, ast.List | ast.Tuple):
        return [_literal(element) for element in node.elts]
    return ast.literal_eval(node)


register_tool_call_parser("llama3_json")(Llama3JsonToolParser)
register_tool_call_parser("pythonic")(PythonicToolParser)
