"""`<think>…</think>` reasoning, as DeepSeek-R1 and Qwen3 (thinking on) emit it.

Both chat templates may open `<think>` in the prompt, so the output either starts with
`<think>` or starts inside the block and shows only `</think>`. We start in reasoning, drop an
optional leading `<think>`, and switch to content at the first `</think>`. An output that ends
without `</think>` was cut off while thinking: it is all reasoning. (Deciding otherwise would
need the whole output before streaming a single reasoning token, and streamed text cannot be
taken back.)

Qwen3 also ends its reasoning at a `<tool_call>` (a model that calls a tool without closing
its think block): the call and what follows are content, for the tool-call parser. vLLM's
Qwen3 parser does the same (its grammar's REASONING + `<tool_call>` transition).
"""

from __future__ import annotations

from stator.parsers.jail import find_first, partial_marker_len
from stator.parsers.reasoning.base import ReasoningDelta, register_reasoning_parser

THINK_START = "<think>"
THINK_END = "</think>"

_PREFIX, _REASONING, _CONTENT = "prefix", "reasoning", "content"


# Markers that end reasoning and stay in the output as content (Qwen3's tool calls).
QWEN3_CONTENT_STARTS = ("<tool_call>",)


class ThinkTagReasoningParser:
    def __init__(self, content_starts: tuple[str, ...] = ()) -> None:
        self._mode = _PREFIX
        self._buffer = ""
        self._ends = (THINK_END, *content_starts)

    def feed(self, text_delta: str) -> ReasoningDelta:
        self._buffer += text_delta
        out = ReasoningDelta()
        if self._mode == _PREFIX and not self._skip_opening_tag():
            return out
        if self._mode == _REASONING:
            found = find_first(self._buffer, self._ends)
            if found is None:
                keep = partial_marker_len(self._buffer, self._ends)
                out.reasoning += self._buffer[: len(self._buffer) - keep]
                self._buffer = self._buffer[len(self._buffer) - keep :]
                return out
            pos, marker = found
            out.reasoning += self._buffer[:pos]
            # `</think>` is dropped; a content start (a tool call) begins the content.
            skip = len(THINK_END) if marker == THINK_END else 0
            self._buffer = self._buffer[pos + skip :]
            self._mode = _CONTENT
        out.content += self._buffer
        self._buffer = ""
        return out

    def finish(self) -> ReasoningDelta:
        # Whatever is still held is part of an unfinished think block (or of its opening tag).
        out = ReasoningDelta(reasoning=self._buffer.strip() if self._mode == _PREFIX else "")
        if self._mode == _REASONING:
            out.reasoning = self._buffer
        elif self._mode == _CONTENT:
            out.content = self._buffer
        self._buffer = ""
        return out

    def _skip_opening_tag(self) -> bool:
        """Prefix mode: True once decided (tag dropped, or none); False while it may come."""
        stripped = self._buffer.lstrip()
        if stripped.startswith(THINK_START):
            self._buffer = stripped[len(THINK_START) :]
        elif THINK_START.startswith(stripped):
            return False
        self._mode = _REASONING
        return True


class PassThroughReasoningParser:
    """Thinking switched off: every token is content."""

    def feed(self, text_delta: str) -> ReasoningDelta:
        return ReasoningDelta(content=text_delta)

    def finish(self) -> ReasoningDelta:
        return ReasoningDelta()


@register_reasoning_parser("deepseek_r1")
def deepseek_r1(**_options: object) -> ThinkTagReasoningParser:
    return ThinkTagReasoningParser()


@register_reasoning_parser("qwen3")
def qwen3(
    *, enable_thinking: bool = True, chat_template_kwargs: dict | None = None, **_options: object
) -> ThinkTagReasoningParser | PassThroughReasoningParser:
    """`enable_thinking` may come directly or inside the request's `chat_template_kwargs`."""
    if chat_template_kwargs and "enable_thinking" in chat_template_kwargs:
        enable_thinking = bool(chat_template_kwargs["enable_thinking"])
    if not enable_thinking:
        return PassThroughReasoningParser()
    return ThinkTagReasoningParser(content_starts=QWEN3_CONTENT_STARTS)
