"""One object per response that splits model text into reasoning, content and tool calls.

The frontend feeds detokenized text; a reasoning parser (if the model has one) takes the
reasoning out, and the tool-call parser (if tools may be called) takes calls out of what is
left. GPT-OSS is the exception: its reasoning and calls come from one Harmony parser, never
from two chained ones (chaining is how others lost calls and leaked reasoning).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from stator.parsers.calls import ToolCall, ToolCallDelta, assemble_calls, new_call_id
from stator.parsers.harmony.stream import HarmonyTextParser
from stator.parsers.reasoning import get_reasoning_parser
from stator.parsers.tool_calls import get_tool_call_parser

HARMONY_PARSERS = ("gpt_oss", "harmony")


@dataclass
class ParsedDelta:
    reasoning: str = ""
    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)

    def __add__(self, other: ParsedDelta) -> ParsedDelta:
        return ParsedDelta(
            self.reasoning + other.reasoning, self.content + other.content, self.calls + other.calls
        )


class OutputParser:
    def __init__(
        self,
        reasoning_parser: str | None = None,
        tool_call_parser: str | None = None,
        *,
        tools: list[dict] | None = None,
        tool_choice: str | dict | None = "auto",
        reasoning_options: dict | None = None,
        id_factory: Callable[[], str] = new_call_id,
    ) -> None:
        """`tool_choice="none"` or no `tools` turns tool-call parsing off: the text stays content."""
        calls_wanted = bool(tools) and tool_choice != "none" and tool_call_parser is not None
        self._harmony: HarmonyTextParser | None = None
        self._calls_wanted = calls_wanted
        if reasoning_parser in HARMONY_PARSERS or tool_call_parser in HARMONY_PARSERS:
            self._harmony = HarmonyTextParser(id_factory)
            return
        self._reasoning = (
            get_reasoning_parser(reasoning_parser, **(reasoning_options or {}))
            if reasoning_parser
            else None
        )
        self._tools = (
            get_tool_call_parser(tool_call_parser, tools, id_factory=id_factory)
            if calls_wanted and tool_call_parser
            else None
        )

    def feed(self, text_delta: str) -> ParsedDelta:
        if self._harmony is not None:
            return self._from_harmony(self._harmony.feed(text_delta))
        return self._chain(text_delta, final=False)

    def finish(self) -> ParsedDelta:
        if self._harmony is not None:
            return self._from_harmony(self._harmony.finish())
        return self._chain("", final=True)

    def parse(self, text: str) -> tuple[str, str, list[ToolCall]]:
        """Non-streaming: (reasoning, content, calls)."""
        delta = self.feed(text) + self.finish()
        return delta.reasoning, delta.content, assemble_calls(delta.calls)

    def _from_harmony(self, delta) -> ParsedDelta:
        calls = delta.calls if self._calls_wanted else []
        return ParsedDelta(delta.reasoning, delta.content, calls)

    def _chain(self, text: str, *, final: bool) -> ParsedDelta:
        out = ParsedDelta()
        if self._reasoning is not None:
            split = self._reasoning.feed(text)
            if final:
                split = split + self._reasoning.finish()
            out.reasoning, text = split.reasoning, split.content
        if self._tools is None:
            out.content = text
            return out
        found = self._tools.feed(text)
        if final:
            found = found + self._tools.finish()
        out.content, out.calls = found.content, found.calls
        return out
