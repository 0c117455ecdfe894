"""Reasoning and tool-call parsing per model, wired to the card's `reasoning_parser` /
`tool_call_parser`.

`ModelParsing.from_card` checks the names once, when the model's pipeline is built (an
unknown name, or a Harmony model whose tokenizer lacks the Harmony special tokens, fails
the model loudly instead of every request). Per choice, `for_request` gives a
`ChoiceParser` that turns postprocessed `Delta`s into `ParsedDelta`s, or None when there is
nothing to parse, so that models without parsers keep the plain per-token path.

Text-level parsers read the detokenized text (after stop strings); GPT-OSS is parsed on
token ids with `HarmonyStreamParser`, never on text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stator.frontend import errors
from stator.frontend.processor.base import ChoiceParser
from stator.llm.postprocess import Delta
from stator.parsers import OutputParser, ParsedDelta, ToolCallDelta
from stator.parsers.calls import new_call_id
from stator.parsers.harmony import (
    ChatConversionError,
    HarmonyRenderer,
    HarmonyStreamParser,
    chat_to_harmony,
)
from stator.parsers.harmony.render import REASONING_EFFORTS
from stator.parsers.output import HARMONY_PARSERS
from stator.parsers.reasoning import reasoning_parser_names
from stator.parsers.reasoning.think_tags import THINK_END, THINK_START
from stator.parsers.tool_calls import get_tool_call_parser, tool_call_parser_names
from stator.protocols import ModelCard
from stator.structured_output import forced_tool_schema, parse_forced_calls


class TextChoiceParser:
    def __init__(self, parser: OutputParser) -> None:
        self._parser = parser

    def feed(self, delta: Delta) -> ParsedDelta:
        return self._parser.feed(delta.text) if delta.text else ParsedDelta()

    def finish(self) -> ParsedDelta:
        return self._parser.finish()


class HarmonyChoiceParser:
    """Harmony on token ids. Calls are dropped when the request allows none
    (`tool_choice: none` or no tools): the model's channels still never reach content."""

    def __init__(self, parser: HarmonyStreamParser, calls_wanted: bool) -> None:
        self._parser = parser
        self._calls_wanted = calls_wanted

    def feed(self, delta: Delta) -> ParsedDelta:
        if not delta.token_ids:
            return ParsedDelta()
        return self._convert(self._parser.feed(delta.token_ids))

    def finish(self) -> ParsedDelta:
        return self._convert(self._parser.finish())

    def _convert(self, delta: Any) -> ParsedDelta:
        calls = delta.calls if self._calls_wanted else []
        return ParsedDelta(delta.reasoning, delta.content, calls)


class ForcedCallsParser:
    """A forced `tool_choice` whose output was constrained to the tools' schema
    (`structured_output.tools`): the whole output is the call(s), read at the finish.
    Output that does not parse (cut off by max_tokens) stays content, and the tool-choice
    check then answers `model_error`."""

    def __init__(self, tool_choice: Any) -> None:
        self._tool_choice = tool_choice
        self._text: list[str] = []

    def feed(self, delta: Delta) -> ParsedDelta:
        if delta.text:
            self._text.append(delta.text)
        return ParsedDelta()

    def finish(self) -> ParsedDelta:
        text = "".join(self._text)
        try:
            calls = parse_forced_calls(text, self._tool_choice)
        except ValueError:
            return ParsedDelta(content=text)
        return ParsedDelta(
            calls=[
                ToolCallDelta(index=i, id=new_call_id(), name=name, arguments_fragment=args)
                for i, (name, args) in enumerate(calls)
            ]
        )


def parser_markers(reasoning_parser: str | None, tool_call_parser: str | None) -> set[str]:
    """The marker strings the model's parsers look for (read off the parser classes)."""
    markers: set[str] = set()
    if reasoning_parser in ("deepseek_r1", "qwen3"):
        markers |= {THINK_START, THINK_END}
    if tool_call_parser is not None and tool_call_parser not in HARMONY_PARSERS:
        parser = get_tool_call_parser(tool_call_parser, [])
        for attr in ("start_markers", "all_markers", "marker_tokens"):
            markers |= set(getattr(parser, attr, ()) or ())
        end = getattr(parser, "end_marker", None)
        if end:
            markers.add(end)
    return markers


@dataclass
class ModelParsing:
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    harmony: HarmonyRenderer | None = None
    # Some vocabularies make a marker a *special* token (Mistral's `[TOOL_CALLS]`, Llama's
    # `<|python_tag|>`): decoding must then keep special tokens, or the parser never sees
    # the marker. The parser removes the markers from content.
    markers_are_special: bool = False
    # The workers can constrain output to a schema (`ModelCard.structured_output`): a
    # required or named tool choice is then enforced with the tools' schema.
    constrain_tools: bool = False

    @classmethod
    def from_card(cls, card: ModelCard, tokenizer: Any) -> ModelParsing:
        """`tokenizer`: the `tokenizers.Tokenizer` of the model. Raises ValueError for an
        unknown parser name and HarmonyVocabularyError for a Harmony model without the
        Harmony special tokens."""
        reasoning, tools = card.reasoning_parser, card.tool_call_parser
        if reasoning is not None and reasoning not in reasoning_parser_names():
            raise ValueError(
                f"model {card.name!r}: unknown reasoning parser {reasoning!r}; "
                f"known: {', '.join(reasoning_parser_names())}"
            )
        if tools is not None and tools not in tool_call_parser_names():
            raise ValueError(
                f"model {card.name!r}: unknown tool-call parser {tools!r}; "
                f"known: {', '.join(tool_call_parser_names())}"
            )
        harmony = None
        if reasoning in HARMONY_PARSERS or tools in HARMONY_PARSERS:
            harmony = HarmonyRenderer(tokenizer)  # HarmonyVocabularyError: loud, at load
        special = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
        markers_are_special = bool(parser_markers(reasoning, tools) & special)
        # Harmony models call tools in their own channel format: not constrained.
        constrain = card.structured_output and harmony is None
        return cls(reasoning, tools, harmony, markers_are_special, constrain)

    @property
    def active(self) -> bool:
        return bool(self.reasoning_parser or self.tool_call_parser)

    @property
    def has_reasoning(self) -> bool:
        return self.reasoning_parser is not None or self.harmony is not None

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return self.harmony.token_ids.stop_token_ids if self.harmony is not None else ()

    def skip_special_tokens(
        self, requested: bool, tools: list[dict] | None, tool_choice: Any
    ) -> bool:
        """Whether to drop special tokens when decoding this request's output."""
        if not requested or not self.markers_are_special:
            return requested
        parses = self.reasoning_parser is not None or (bool(tools) and tool_choice != "none")
        return not parses

    def check_tool_choice(self, tools: list[dict] | None, tool_choice: Any) -> None:
        """A required or named tool choice needs a parser that can find calls (400)."""
        forced = tool_choice == "required" or isinstance(tool_choice, dict)
        if forced and not tools:
            raise errors.bad_request(
                "tool_choice requires a tool call but no tools were given.", param="tool_choice"
            )
        if isinstance(tool_choice, dict):
            name = tool_choice["function"]["name"]
            known = [(t.get("function") or t).get("name") for t in tools or []]
            if name not in known:
                raise errors.bad_request(
                    f"tool_choice names function {name!r}, which is not among the tools.",
                    param="tool_choice",
                )
        constrained = self.constrain_tools
        if forced and self.tool_call_parser is None and self.harmony is None and not constrained:
            raise errors.bad_request(
                "This model cannot return tool calls: its worker runs without a tool-call "
                "parser (start it with --tool-call-parser).",
                param="tool_choice",
            )

    def forced_tool_schema(self, tools: list[dict] | None, tool_choice: Any) -> dict | None:
        """The JSON schema a forced tool choice constrains the output to, when enforced."""
        if not self.constrain_tools:
            return None
        return forced_tool_schema(tools, tool_choice)

    def for_request(
        self,
        tokenizer: Any,
        tools: list[dict] | None,
        tool_choice: Any,
        template_kwargs: dict | None,
    ) -> ChoiceParser | None:
        if self.forced_tool_schema(tools, tool_choice) is not None:
            return ForcedCallsParser(tool_choice)
        if not self.active:
            return None
        calls_wanted = bool(tools) and tool_choice != "none"
        if self.harmony is not None:
            stream = HarmonyStreamParser(tokenizer, self.harmony.token_ids)
            return HarmonyChoiceParser(stream, calls_wanted)
        if self.reasoning_parser is None and not calls_wanted:
            return None  # a tool-call parser with nothing to call: plain text
        return TextChoiceParser(
            OutputParser(
                self.reasoning_parser,
                self.tool_call_parser,
                tools=tools,
                tool_choice=tool_choice if tool_choice is not None else "auto",
                reasoning_options=template_kwargs or {},
            )
        )

    def harmony_prompt(
        self, messages: list[dict], tools: list[dict] | None, reasoning_effort: str | None
    ) -> list[int]:
        assert self.harmony is not None
        if reasoning_effort is not None and reasoning_effort not in REASONING_EFFORTS:
            raise errors.bad_request(
                f"GPT-OSS takes reasoning_effort {', '.join(REASONING_EFFORTS)}; "
                f"got {reasoning_effort!r}.",
                param="reasoning_effort",
            )
        try:
            conversation = chat_to_harmony(
                messages, tools=tools, reasoning_effort=reasoning_effort or "medium"
            )
        except ChatConversionError as exc:
            raise errors.bad_request(str(exc), param="messages") from exc
        return self.harmony.render_for_completion(conversation)
