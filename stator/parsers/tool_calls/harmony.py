"""GPT-OSS tool calls at the text level (`commentary to=functions.NAME`); analysis text is
reasoning and never becomes content here. See `stator.parsers.harmony` for token ids."""

from __future__ import annotations

from collections.abc import Callable

from stator.parsers.harmony.stream import HarmonyTextParser
from stator.parsers.tool_calls.base import (
    ToolCall,
    ToolDelta,
    assemble_calls,
    register_tool_call_parser,
)


class HarmonyToolParser:
    def __init__(self, *, tools: list[dict], id_factory: Callable[[], str]) -> None:
        self._parser = HarmonyTextParser(id_factory)

    def feed(self, text_delta: str) -> ToolDelta:
        delta = self._parser.feed(text_delta)
        return ToolDelta(content=delta.content, calls=delta.calls)

    def finish(self) -> ToolDelta:
        delta = self._parser.finish()
        return ToolDelta(content=delta.content, calls=delta.calls)

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        delta = self.feed(text) + self.finish()
        return delta.content, assemble_calls(delta.calls)


register_tool_call_parser("harmony")(HarmonyToolParser)
