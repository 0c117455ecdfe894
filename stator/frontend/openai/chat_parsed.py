"""Chat output of models with reasoning or tool-call parsers: `reasoning_content` /
`reasoning`, `tool_calls` and `finish_reason: "tool_calls"`, streamed and not.

Only used when the request has parsers (its processor gave every choice one);
every other model keeps `chat.py`'s plain text path. A choice that breaks a required or
named `tool_choice` is a `model_error` (500, as OpenAI answers invalid model output); in a
stream, an error event in place of the finish chunk.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from msgspec import UNSET

from stator.frontend import errors
from stator.frontend.metrics import GenerationTracker
from stator.frontend.openai.objects import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprobs,
    ChatMessageOut,
    chat_logprobs,
    chat_usage,
    to_json,
)
from stator.frontend.openai.requests import ChatCompletionRequest
from stator.frontend.openai.streaming import DONE, TextChunks, sse, sse_error
from stator.frontend.pipelines import ModelPipeline
from stator.frontend.processor import ChoiceParser
from stator.frontend.routing import ChoiceStream, EngineFailed, merged_deltas
from stator.llm.postprocess import Delta
from stator.parsers import ParsedDelta, ToolCall, ToolCallDelta
from stator.parsers.calls import assemble_calls
from stator.parsers.tool_calls import ToolChoiceError, validate_tool_choice


def parse_delta(parser: ChoiceParser, delta: Delta) -> ParsedDelta:
    parsed = parser.feed(delta)
    if delta.finish_reason is not None:
        parsed = parsed + parser.finish()
    return parsed


def tool_call_json(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments_json},
    }


def tool_call_delta_json(call: ToolCallDelta) -> dict[str, Any]:
    """As OpenAI streams a call: index, id, type and name first, then argument pieces."""
    if call.name is None:
        return {"index": call.index, "function": {"arguments": call.arguments_fragment}}
    return {
        "index": call.index,
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments_fragment},
    }


def tool_call_deltas_json(calls: list[ToolCallDelta]) -> list[dict[str, Any]]:
    """A chunk's calls, a call's consecutive pieces merged into one entry."""
    out: list[dict[str, Any]] = []
    for call in calls:
        if out and call.name is None and out[-1]["index"] == call.index:
            out[-1]["function"]["arguments"] += call.arguments_fragment
        else:
            out.append(tool_call_delta_json(call))
    return out


def finish_reason(engine_reason: str | None, has_calls: bool) -> str:
    reason = engine_reason or "stop"
    return "tool_calls" if has_calls and reason == "stop" else reason


def check_tool_choice(body: ChatCompletionRequest, calls: list[ToolCall], index: int) -> None:
    try:
        validate_tool_choice(body.tool_choice, calls, body.tools)
    except ToolChoiceError as exc:
        raise errors.model_error(
            f"Choice {index}: the model produced invalid content: {exc}."
        ) from exc


@dataclass
class _Collected:
    reasoning: list[str] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    calls: list[ToolCallDelta] = field(default_factory=list)
    logprobs: ChatLogprobs | None = None
    finish: Delta | None = None

    def add(self, parsed: ParsedDelta) -> None:
        if parsed.reasoning:
            self.reasoning.append(parsed.reasoning)
        if parsed.content:
            self.content.append(parsed.content)
        self.calls += parsed.calls


async def parsed_chat_result(
    body: ChatCompletionRequest,
    pipeline: ModelPipeline,
    streams: list[ChoiceStream],
    parsers: list[ChoiceParser],
    tracker: GenerationTracker,
    response_id: str,
    created: int,
) -> ChatCompletion:
    collected = [_Collected() for _ in streams]
    async for index, delta in merged_deltas(streams):
        tracker.output()
        out = collected[index]
        out.add(parse_delta(parsers[index], delta))
        lp = chat_logprobs(delta)
        if lp is not None:
            if out.logprobs is None:
                out.logprobs = ChatLogprobs(content=[])
            out.logprobs.content.extend(lp.content)
        if delta.finish_reason is not None:
            out.finish = delta
    show_reasoning = body.include_reasoning and pipeline.processor.has_reasoning
    choices = []
    for i, out in enumerate(collected):
        calls = assemble_calls(out.calls)
        check_tool_choice(body, calls, i)
        content = "".join(out.content)
        reasoning = "".join(out.reasoning) or None
        message = ChatMessageOut(
            role="assistant",
            content=None if calls and not content else content,
            reasoning_content=reasoning if show_reasoning else UNSET,
            reasoning=reasoning if show_reasoning else UNSET,
            tool_calls=[tool_call_json(c) for c in calls] if calls else UNSET,
        )
        finish = out.finish
        choices.append(
            ChatChoice(
                index=i,
                message=message,
                logprobs=out.logprobs,
                finish_reason=finish_reason(finish.finish_reason if finish else None, bool(calls)),
                stop_reason=finish.stop_reason if finish else None,
            )
        )
    return ChatCompletion(
        id=response_id,
        created=created,
        model=pipeline.name,
        choices=choices,
        usage=chat_usage(streams),
    )


def chat_text_chunks(
    response_id: str, created: int, model: str, usage: Any, *fields: str
) -> TextChunks:
    """The text-only chunks of a chat stream, the text in each of the delta's `fields`."""
    return TextChunks(
        lambda index, text: ChatCompletionChunk(
            response_id,
            created,
            model,
            [ChatChunkChoice(index=index, delta=ChatDelta(**dict.fromkeys(fields, text)))],
            usage=usage,
        )
    )


async def parsed_chat_chunks(
    body: ChatCompletionRequest,
    pipeline: ModelPipeline,
    streams: list[ChoiceStream],
    parsers: list[ChoiceParser],
    tracker: GenerationTracker,
    response_id: str,
    created: int,
) -> AsyncIterator[bytes]:
    model = pipeline.name
    usage_field = None if body.include_usage else UNSET
    show_reasoning = body.include_reasoning

    def chunk(choice: ChatChunkChoice) -> bytes:
        return sse(
            to_json(ChatCompletionChunk(response_id, created, model, [choice], usage=usage_field))
        )

    for stream in streams:
        yield chunk(
            ChatChunkChoice(index=stream.index, delta=ChatDelta(role="assistant", content=""))
        )
    want_logprobs = bool(body.logprobs)
    calls: list[list[ToolCallDelta]] = [[] for _ in streams]
    # Chunks carrying only content, or only reasoning (nearly all of them), come from
    # pre-split templates, as on the plain path.
    content_chunks = chat_text_chunks(response_id, created, model, usage_field, "content")
    reasoning_chunks = chat_text_chunks(
        response_id, created, model, usage_field, "reasoning_content", "reasoning"
    )

    try:
        async for index, delta in merged_deltas(streams):
            tracker.output()
            parsed = parse_delta(parsers[index], delta)
            reasoning = parsed.reasoning if show_reasoning else ""
            if delta.finish_reason is None and not want_logprobs and not parsed.calls:
                if parsed.content and not reasoning:
                    yield content_chunks.render(index, parsed.content)
                elif reasoning and not parsed.content:
                    yield reasoning_chunks.render(index, reasoning)
                elif reasoning:
                    yield chunk(
                        ChatChunkChoice(
                            index=index,
                            delta=ChatDelta(
                                content=parsed.content,
                                reasoning_content=reasoning,
                                reasoning=reasoning,
                            ),
                        )
                    )
                continue
            out = ChatDelta()
            if reasoning:
                out.reasoning_content = out.reasoning = reasoning
            if parsed.content:
                out.content = parsed.content
            if parsed.calls:
                calls[index] += parsed.calls
                out.tool_calls = tool_call_deltas_json(parsed.calls)
            logprobs = chat_logprobs(delta) if want_logprobs else None
            if delta.finish_reason is None:
                if reasoning or parsed.content or parsed.calls or logprobs is not None:
                    yield chunk(ChatChunkChoice(index=index, delta=out, logprobs=logprobs))
                continue
            assembled = assemble_calls(calls[index])
            try:
                check_tool_choice(body, assembled, index)
            except errors.ApiError as exc:
                yield sse_error(exc)
                yield DONE
                return
            yield chunk(
                ChatChunkChoice(
                    index=index,
                    delta=out,
                    logprobs=logprobs,
                    finish_reason=finish_reason(delta.finish_reason, bool(assembled)),
                    stop_reason=delta.stop_reason,
                )
            )
    except EngineFailed as exc:
        yield sse_error(errors.engine_failed_from(exc))
        yield DONE
        return
    if body.include_usage:
        usage = chat_usage(streams)
        yield sse(to_json(ChatCompletionChunk(response_id, created, model, [], usage=usage)))
    yield DONE
