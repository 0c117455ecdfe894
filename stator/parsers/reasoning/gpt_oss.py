"""GPT-OSS reasoning at the text level: the Harmony `analysis` channel is reasoning.

The frontend should prefer `stator.parsers.harmony.HarmonyStreamParser` on token ids, which
yields reasoning, content and tool calls from one parser. This text-level view serves
pipelines that see text with the special tokens written out; tool calls found here are kept
on `tool_calls` (and are never shown as content).
"""

from __future__ import annotations

from stator.parsers.calls import ToolCallDelta
from stator.parsers.harmony.messages import HarmonyDelta
from stator.parsers.harmony.stream import HarmonyTextParser
from stator.parsers.reasoning.base import ReasoningDelta, register_reasoning_parser


class GptOssReasoningParser:
    def __init__(self) -> None:
        self._parser = HarmonyTextParser()
        self.tool_calls: list[ToolCallDelta] = []

    def feed(self, text_delta: str) -> ReasoningDelta:
        return self._split(self._parser.feed(text_delta))

    def finish(self) -> ReasoningDelta:
        return self._split(self._parser.finish())

    def _split(self, delta: HarmonyDelta) -> ReasoningDelta:
        self.tool_calls.extend(delta.calls)
        return ReasoningDelta(reasoning=delta.reasoning, content=delta.content)


@register_reasoning_parser("gpt_oss")
def gpt_oss(**_options: object) -> GptOssReasoningParser:
    return GptOssReasoningParser()
