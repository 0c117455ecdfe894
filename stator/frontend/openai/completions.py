"""`POST /v1/completions`: prompts (text, texts, token ids, lists of token ids) through
the pipeline, answered as one `text_completion` or as a stream of them.

Choices are numbered `prompt_index * n + choice_index`, as OpenAI does.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from msgspec import UNSET
from starlette.responses import Response
from starlette.types import Receive

from stator.frontend import errors
from stator.frontend.metrics import GenerationTracker
from stator.frontend.openai.objects import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    to_json,
    usage_info,
)
from stator.frontend.openai.requests import CompletionRequest
from stator.frontend.openai.streaming import (
    DONE,
    ClientGone,
    SSEResponse,
    TextChunks,
    cancel_on_disconnect,
    client_gone_response,
    sse,
    sse_error,
)
from stator.frontend.pipelines import ModelPipeline
from stator.frontend.routing import ChoiceStream, EngineFailed, merged_deltas, prime_all
from stator.llm.postprocess import Delta


class LogprobsBuilder:
    """OpenAI's legacy completions logprobs: parallel lists, offsets into the choice text."""

    def __init__(self, offset: int) -> None:
        self.offset = offset

    def add(self, delta: Delta, into: CompletionLogprobs) -> None:
        for lp in delta.logprobs or ():
            into.tokens.append(lp.token)
            into.token_logprobs.append(lp.logprob)
            into.top_logprobs.append({alt.token: alt.logprob for alt in lp.top})
            into.text_offset.append(self.offset)
            self.offset += len(lp.token)


def _check_supported(body: CompletionRequest) -> None:
    if body.suffix is not None:
        raise errors.bad_request("suffix is not supported.", param="suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise errors.bad_request("best_of other than n is not supported.", param="best_of")
    if body.echo and body.logprobs is not None:
        # Needs prompt logprobs from the engine, which the pipeline does not request.
        raise errors.bad_request("echo together with logprobs is not supported.", param="logprobs")


async def create_completion(
    body: CompletionRequest, pipeline: ModelPipeline, request_id: str, receive: Receive
) -> Response | SSEResponse:
    _check_supported(body)
    prepared = await pipeline.processor.completion(body, request_id)
    prompts = prepared.prompts
    streams = pipeline.open(prepared)
    prompt_tokens = prepared.prompt_tokens
    tracker = GenerationTracker(pipeline.model_metrics, prompt_tokens)
    try:
        await cancel_on_disconnect(receive, prime_all(streams))
    except ClientGone:
        tracker.finish(0, 0, disconnected=True)
        return client_gone_response()
    except BaseException:
        tracker.finish(0, 0, disconnected=False)
        raise
    # Echo is refused with embeddings (completion_prompts): every prompt here is ids.
    echoes = [pipeline.processor.decode_prompt(p) if body.echo else "" for p in prompts]  # type: ignore[arg-type]
    context = _Context(body, pipeline, streams, tracker, echoes, prompt_tokens, request_id)

    def totals() -> tuple[int, int]:
        return sum(s.completion_tokens for s in streams), _cached(streams, body.n)

    if body.stream:
        return SSEResponse(
            context.chunks(),
            on_close=lambda gone: tracker.finish(*totals(), disconnected=gone),
        )
    gone = False
    try:
        result = await cancel_on_disconnect(receive, context.result())
    except ClientGone:
        gone = True
        return client_gone_response()
    except EngineFailed as exc:
        raise errors.engine_failed_from(exc) from exc
    finally:
        tracker.finish(*totals(), disconnected=gone)
    return Response(to_json(result), media_type="application/json")


def _cached(streams: list[ChoiceStream], n: int) -> int:
    # Each prompt is counted once, however many choices it has.
    return sum(s.cached_tokens for s in streams[::n])


class _Context:
    def __init__(
        self,
        body: CompletionRequest,
        pipeline: ModelPipeline,
        streams: list[ChoiceStream],
        tracker: GenerationTracker,
        echoes: list[str],
        prompt_tokens: int,
        request_id: str,
    ) -> None:
        self.body = body
        self.pipeline = pipeline
        self.streams = streams
        self.tracker = tracker
        self.echoes = echoes
        self.prompt_tokens = prompt_tokens
        self.id = f"cmpl-{request_id}"
        self.created = int(time.time())
        self.logprobs = [LogprobsBuilder(len(echoes[i // body.n])) for i in range(len(streams))]

    def usage(self):
        return usage_info(
            self.prompt_tokens,
            sum(s.completion_tokens for s in self.streams),
            _cached(self.streams, self.body.n),
        )

    async def result(self) -> Completion:
        n = self.body.n
        texts = [[self.echoes[i // n]] for i in range(len(self.streams))]
        logprobs = [
            CompletionLogprobs() if self.body.logprobs is not None else None for _ in self.streams
        ]
        finish: list[Delta | None] = [None] * len(self.streams)
        async for index, delta in merged_deltas(self.streams):
            self.tracker.output()
            if delta.text:
                texts[index].append(delta.text)
            if logprobs[index] is not None:
                self.logprobs[index].add(delta, logprobs[index])  # type: ignore[arg-type]
            if delta.finish_reason is not None:
                finish[index] = delta
        choices = [
            CompletionChoice(
                index=i,
                text="".join(texts[i]),
                logprobs=logprobs[i],
                finish_reason=finish[i].finish_reason if finish[i] else "stop",  # type: ignore[union-attr]
                stop_reason=finish[i].stop_reason if finish[i] else None,  # type: ignore[union-attr]
            )
            for i in range(len(self.streams))
        ]
        return Completion(self.id, self.created, self.pipeline.name, choices, usage=self.usage())

    async def chunks(self) -> AsyncIterator[bytes]:
        body, model = self.body, self.pipeline.name
        usage_field = None if body.include_usage else UNSET
        pending_echo = [bool(self.echoes[i // body.n]) for i in range(len(self.streams))]
        # Chunks that only carry text (nearly all of them) come from a pre-split template.
        text_chunks = TextChunks(
            lambda index, text: Completion(
                self.id,
                self.created,
                model,
                [CompletionChoice(index=index, text=text, logprobs=None, finish_reason=None)],
                usage=usage_field,
            )
        )

        try:
            async for index, delta in merged_deltas(self.streams):
                self.tracker.output()
                text = delta.text
                if pending_echo[index]:
                    text = self.echoes[index // body.n] + text
                    pending_echo[index] = False
                if delta.finish_reason is None and body.logprobs is None:
                    yield text_chunks.render(index, text)
                    continue
                logprobs = None
                if body.logprobs is not None:
                    logprobs = CompletionLogprobs()
                    self.logprobs[index].add(delta, logprobs)
                choice = CompletionChoice(
                    index=index, text=text, logprobs=logprobs, finish_reason=delta.finish_reason
                )
                if delta.finish_reason is not None:
                    choice.stop_reason = delta.stop_reason
                yield sse(
                    to_json(Completion(self.id, self.created, model, [choice], usage=usage_field))
                )
        except EngineFailed as exc:
            yield sse_error(errors.engine_failed_from(exc))
            yield DONE
            return
        if body.include_usage:
            yield sse(to_json(Completion(self.id, self.created, model, [], usage=self.usage())))
        yield DONE
