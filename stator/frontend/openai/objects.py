"""OpenAI response bodies as msgspec Structs: encoded once per chunk without pydantic.

Fields OpenAI always sends (even as null: `finish_reason`, `logprobs`) are required
fields; fields it sends only sometimes default to `UNSET`, which msgspec leaves out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec
from msgspec import UNSET, UnsetType

from stator.llm.postprocess import Delta

if TYPE_CHECKING:
    from stator.frontend.routing import ChoiceStream


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int = 0


class UsageInfo(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


# -- chat --------------------------------------------------------------------------------


class TopLogprobEntry(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]


class ChatLogprobEntry(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprobEntry]


class ChatLogprobs(msgspec.Struct):
    content: list[ChatLogprobEntry]


class ChatMessageOut(msgspec.Struct):
    role: str
    content: str | None
    reasoning_content: str | UnsetType | None = UNSET
    reasoning: str | UnsetType | None = UNSET
    tool_calls: list[dict[str, Any]] | UnsetType = UNSET


class ChatChoice(msgspec.Struct):
    index: int
    message: ChatMessageOut
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    stop_reason: str | int | None = None


class ChatCompletion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    object: str = "chat.completion"
    system_fingerprint: str | None = None


class ChatDelta(msgspec.Struct, omit_defaults=True):
    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET
    reasoning: str | UnsetType = UNSET
    tool_calls: list[dict[str, Any]] | UnsetType = UNSET


class ChatChunkChoice(msgspec.Struct):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: str | int | UnsetType | None = UNSET


class ChatCompletionChunk(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    object: str = "chat.completion.chunk"
    system_fingerprint: str | None = None
    usage: UsageInfo | UnsetType | None = UNSET


# -- completions -------------------------------------------------------------------------


class CompletionLogprobs(msgspec.Struct):
    tokens: list[str] = msgspec.field(default_factory=list)
    token_logprobs: list[float | None] = msgspec.field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = msgspec.field(default_factory=list)
    text_offset: list[int] = msgspec.field(default_factory=list)


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None
    stop_reason: str | int | UnsetType | None = UNSET


class Completion(msgspec.Struct):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    object: str = "text_completion"
    system_fingerprint: str | None = None
    usage: UsageInfo | UnsetType | None = UNSET


# -- models ------------------------------------------------------------------------------


class ModelObject(msgspec.Struct):
    id: str
    created: int
    owned_by: str = "stator"
    object: str = "model"
    max_model_len: int | UnsetType = UNSET
    parent: str | UnsetType = UNSET  # a LoRA adapter's base model


class ModelList(msgspec.Struct):
    data: list[ModelObject]
    object: str = "list"


_encoder = msgspec.json.Encoder()


def to_json(obj: Any) -> bytes:
    return _encoder.encode(obj)


def chat_logprobs(delta: Delta) -> ChatLogprobs | None:
    if not delta.logprobs:
        return None
    return ChatLogprobs(
        content=[
            ChatLogprobEntry(
                token=lp.token,
                logprob=lp.logprob,
                bytes=lp.bytes,
                top_logprobs=[TopLogprobEntry(t.token, t.logprob, t.bytes) for t in lp.top],
            )
            for lp in delta.logprobs
        ]
    )


def chat_usage(streams: Sequence[ChoiceStream]) -> UsageInfo:
    """Usage of a chat request: one prompt, `n` choices."""
    return usage_info(
        len(streams[0].request.token_ids),
        sum(s.completion_tokens for s in streams),
        streams[0].cached_tokens,
    )


def usage_info(prompt: int, completion: int, cached: int) -> UsageInfo:
    return UsageInfo(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
    )
