"""`POST /v1/chat/completions`: a chat request through the pipeline, answered as one
`chat.completion` or as a stream of `chat.completion.chunk`s."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from msgspec import UNSET
from starlette.responses import Response
from starlette.types import Receive

from stator.frontend import errors
from stator.frontend.metrics import GenerationTracker
from stator.frontend.openai.chat_parsed import (
    chat_text_chunks,
    parsed_chat_chunks,
    parsed_chat_result,
)
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
from stator.frontend.openai.streaming import (
    DONE,
    ClientGone,
    SSEResponse,
    cancel_on_disconnect,
    client_gone_response,
    sse,
    sse_error,
)
from stator.frontend.pipelines import ModelPipeline
from stator.frontend.routing import ChoiceStream, EngineFailed, merged_deltas, prime_all
from stator.llm.postprocess import Delta


async def create_chat_completion(
    body: ChatCompletionRequest, pipeline: ModelPipeline, request_id: str, receive: Receive
) -> Response | SSEResponse:
    prepared = await pipeline.processor.chat(body, request_id)
    streams = pipeline.open(prepared)
    tracker = GenerationTracker(pipeline.model_metrics, prepared.prompt_tokens)
    try:
        await cancel_on_disconnect(receive, prime_all(streams))
    except ClientGone:
        tracker.finish(0, 0, disconnected=True)
        return client_gone_response()
    except BaseException:
        tracker.finish(0, 0, disconnected=False)
        raise
    response_id = f"chatcmpl-{request_id}"
    created = int(time.time())
    parsers = prepared.parsers
    if body.stream:
        chunks = (
            chat_chunks(body, pipeline, streams, tracker, response_id, created)
            if parsers is None
            else parsed_chat_chunks(body, pipeline, streams, parsers, tracker, response_id, created)
        )
        return SSEResponse(
            chunks,
            on_close=lambda gone: tracker.finish(
                sum(s.completion_tokens for s in streams),
                streams[0].cached_tokens,
                disconnected=gone,
            ),
        )
    gone = False
    try:
        work = (
            chat_result(pipeline, streams, tracker, response_id, created)
            if parsers is None
            else parsed_chat_result(body, pipeline, streams, parsers, tracker, response_id, created)
        )
        result = await cancel_on_disconnect(receive, work)
    except ClientGone:
        gone = True
        return client_gone_response()
    except EngineFailed as exc:
        raise errors.engine_failed_from(exc) from exc
    finally:
        tracker.finish(
            sum(s.completion_tokens for s in streams), streams[0].cached_tokens, disconnected=gone
        )
    return Response(to_json(result), media_type="application/json")


async def chat_result(
    pipeline: ModelPipeline,
    streams: list[ChoiceStream],
    tracker: GenerationTracker,
    response_id: str,
    created: int,
) -> ChatCompletion:
    texts: list[list[str]] = [[] for _ in streams]
    logprobs: list[ChatLogprobs | None] = [None for _ in streams]
    finish: list[Delta | None] = [None for _ in streams]
    async for index, delta in merged_deltas(streams):
        tracker.output()
        if delta.text:
            texts[index].append(delta.text)
        lp = chat_logprobs(delta)
        if lp is not None:
            if logprobs[index] is None:
                logprobs[index] = ChatLogprobs(content=[])
            logprobs[index].content.extend(lp.content)  # type: ignore[union-attr]
        if delta.finish_reason is not None:
            finish[index] = delta
    choices = [
        ChatChoice(
            index=i,
            message=ChatMessageOut(role="assistant", content="".join(texts[i])),
            logprobs=logprobs[i],
            finish_reason=finish[i].finish_reason if finish[i] else "stop",
            stop_reason=finish[i].stop_reason if finish[i] else None,
        )
        for i in range(len(streams))
    ]
    return ChatCompletion(
        id=response_id,
        created=created,
        model=pipeline.name,
        choices=choices,
        usage=chat_usage(streams),
    )


async def chat_chunks(
    body: ChatCompletionRequest,
    pipeline: ModelPipeline,
    streams: list[ChoiceStream],
    tracker: GenerationTracker,
    response_id: str,
    created: int,
) -> AsyncIterator[bytes]:
    model = pipeline.name
    usage_field = None if body.include_usage else UNSET
    for stream in streams:
        # OpenAI's first chunk of each choice carries the role and empty content.
        first = ChatChunkChoice(index=stream.index, delta=ChatDelta(role="assistant", content=""))
        yield sse(
            to_json(ChatCompletionChunk(response_id, created, model, [first], usage=usage_field))
        )
    want_logprobs = bool(body.logprobs)
    # Chunks that only carry text (nearly all of them) come from a pre-split template.
    text_chunks = chat_text_chunks(response_id, created, model, usage_field, "content")

    try:
        async for index, delta in merged_deltas(streams):
            tracker.output()
            if delta.finish_reason is None and not want_logprobs:
                yield text_chunks.render(index, delta.text)
                continue
            choice = ChatChunkChoice(
                index=index,
                delta=ChatDelta(content=delta.text) if delta.text else ChatDelta(),
                logprobs=chat_logprobs(delta) if want_logprobs else None,
                finish_reason=delta.finish_reason,
            )
            if delta.finish_reason is not None:
                choice.stop_reason = delta.stop_reason
            yield sse(
                to_json(
                    ChatCompletionChunk(response_id, created, model, [choice], usage=usage_field)
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
