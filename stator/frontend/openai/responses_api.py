"""`POST /v1/responses`: the Responses API on top of a model's chat pipeline.

The request is translated to a chat request (`stator.llm.responses`: input items, tools,
tool_choice), prepended with the stored conversation when `previous_response_id` is given,
rendered by the model's chat template (or Harmony for GPT-OSS), generated as one choice,
parsed by the model's parsers and turned into output items by `ResponseBuilder`: the same
builder answers the non-streaming request and emits the event stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError
from starlette.responses import Response
from starlette.types import Receive

from stator.frontend import errors
from stator.frontend.metrics import GenerationTracker
from stator.frontend.openai.chat_parsed import parse_delta
from stator.frontend.openai.objects import to_json
from stator.frontend.openai.requests import ChatCompletionRequest, ResponsesRequest
from stator.frontend.openai.streaming import (
    ClientGone,
    SSEResponse,
    cancel_on_disconnect,
    client_gone_response,
)
from stator.frontend.pipelines import ModelPipeline
from stator.frontend.processor import ChoiceParser
from stator.frontend.routing import ChoiceStream, EngineFailed, prime_all
from stator.llm.postprocess import Delta
from stator.llm.responses import (
    ResponseBuilder,
    ResponsesInputError,
    ResponseStore,
    ResponseUsage,
    UnknownResponseError,
    continue_conversation,
    input_to_messages,
    tool_choice_to_chat,
    tools_to_chat,
)
from stator.parsers import ParsedDelta, ToolCallDelta
from stator.parsers.calls import assemble_calls
from stator.parsers.tool_calls import ToolChoiceError, validate_tool_choice
from stator.protocols import INVALID_REQUEST


def translate(
    body: ResponsesRequest, store: ResponseStore
) -> tuple[list[dict], ChatCompletionRequest]:
    """(the conversation to store, the chat request to run). Instructions apply to this
    request only, as OpenAI does: they are not part of the stored conversation."""
    if isinstance(body.input, list) and not body.input:
        raise errors.bad_request("'input' must not be empty.", param="input")
    try:
        messages = input_to_messages(body.input)
        tools = tools_to_chat(body.tools) or None
        tool_choice = tool_choice_to_chat(body.tool_choice)
    except ResponsesInputError as exc:
        raise errors.bad_request(str(exc), param=exc.param) from exc
    try:
        conversation = continue_conversation(store, body.previous_response_id, messages)
    except UnknownResponseError as exc:
        raise errors.ApiError(
            404,
            f"Previous response with id '{exc.response_id}' not found.",
            type="invalid_request_error",
            param="previous_response_id",
            code="previous_response_not_found",
        ) from exc
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    fields: dict[str, Any] = {
        "model": body.model,
        "messages": [*system, *conversation],
        "tools": tools,
        "tool_choice": tool_choice,
        "max_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "reasoning_effort": body.reasoning.effort if body.reasoning else None,
        # A processor that parses streams and whole outputs differently (vLLM's) parses
        # as the response is delivered.
        "stream": body.stream,
    }
    try:
        chat = ChatCompletionRequest.model_validate(
            {k: v for k, v in fields.items() if v is not None}
        )
    except ValidationError as exc:
        raise errors.validation_error(exc.errors()) from None
    return conversation, chat


def request_echo(body: ResponsesRequest) -> dict[str, Any]:
    """The request fields a response object repeats."""
    return {
        "instructions": body.instructions,
        "tools": body.tools or [],
        "tool_choice": body.tool_choice or "auto",
        "parallel_tool_calls": body.parallel_tool_calls,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "max_output_tokens": body.max_output_tokens,
        "previous_response_id": body.previous_response_id,
        "reasoning": {
            "effort": body.reasoning.effort if body.reasoning else None,
            "summary": None,
        },
        "store": body.store,
        "metadata": body.metadata or {},
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "user": body.user,
    }


class ResponseRun:
    """One response being generated: the choice's deltas into builder events."""

    def __init__(
        self,
        body: ResponsesRequest,
        chat: ChatCompletionRequest,
        conversation: list[dict],
        stream: ChoiceStream,
        parser: ChoiceParser | None,
        store: ResponseStore,
        tracker: GenerationTracker,
        model: str,
    ) -> None:
        self.body = body
        self.chat = chat
        self.conversation = conversation
        self.stream = stream
        self.parser = parser
        self.store = store
        self.tracker = tracker
        self.builder = ResponseBuilder(model, request_echo=request_echo(body))
        self.calls: list[ToolCallDelta] = []
        self.reasoning_tokens = 0

    def _parse(self, delta: Delta) -> ParsedDelta:
        if self.parser is None:
            return ParsedDelta(content=delta.text)
        parsed = parse_delta(self.parser, delta)
        if parsed.reasoning and not parsed.content and not parsed.calls:
            self.reasoning_tokens += len(delta.token_ids)
        return parsed

    async def events(self) -> AsyncIterator[dict]:
        """Every event in order; the last one completes, leaves incomplete, or fails."""
        for event in self.builder.start():
            yield event
        try:
            async for delta in self.stream.deltas():
                self.tracker.output()
                parsed = self._parse(delta)
                self.calls += parsed.calls
                for event in self.builder.add(parsed.reasoning, parsed.content, parsed.calls):
                    yield event
                if delta.finish_reason is not None:
                    for event in self._finish(delta):
                        yield event
                    return
        except EngineFailed as exc:
            refused = exc.code == INVALID_REQUEST
            code = INVALID_REQUEST if refused else "server_error"
            for event in self.builder.fail(f"The worker failed the request: {exc}", code):
                yield event

    def _finish(self, delta: Delta) -> list[dict]:
        try:
            validate_tool_choice(self.chat.tool_choice, assemble_calls(self.calls), self.chat.tools)
        except ToolChoiceError as exc:
            return self.builder.fail(
                f"The model produced invalid content: {exc}.", code="invalid_model_output"
            )
        usage = ResponseUsage(
            input_tokens=self.stream.prompt_tokens,
            output_tokens=self.stream.completion_tokens,
            cached_tokens=self.stream.cached_tokens,
            reasoning_tokens=self.reasoning_tokens,
        )
        incomplete = "max_output_tokens" if delta.finish_reason == "length" else None
        events = self.builder.finish(usage, incomplete_reason=incomplete)
        if self.body.store:
            response = self.builder.response
            self.store.put(response["id"], self.conversation, response)
        return events

    async def result(self) -> dict:
        async for _event in self.events():
            pass
        response = self.builder.response
        if response["status"] == "failed":
            error = response["error"]
            if error["code"] == "invalid_model_output":
                raise errors.model_error(error["message"])
            if error["code"] == INVALID_REQUEST:
                raise errors.bad_request(error["message"], code=INVALID_REQUEST)
            raise errors.engine_failed(error["message"])
        return response


def sse_event(event: dict) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + to_json(event) + b"\n\n"


async def create_response(
    body: ResponsesRequest,
    pipeline: ModelPipeline,
    store: ResponseStore,
    request_id: str,
    receive: Receive,
) -> Response | SSEResponse:
    conversation, chat = translate(body, store)
    prepared = await pipeline.processor.chat(chat, request_id)
    (stream,) = pipeline.open(prepared)
    parser = prepared.choices[0].parser
    tracker = GenerationTracker(pipeline.model_metrics, prepared.prompt_tokens)
    try:
        await cancel_on_disconnect(receive, prime_all([stream]))
    except ClientGone:
        tracker.finish(0, 0, disconnected=True)
        return client_gone_response()
    except BaseException:
        tracker.finish(0, 0, disconnected=False)
        raise
    run = ResponseRun(body, chat, conversation, stream, parser, store, tracker, pipeline.name)

    def done(gone: bool) -> None:
        tracker.finish(stream.completion_tokens, stream.cached_tokens, disconnected=gone)

    if body.stream:

        async def framed() -> AsyncIterator[bytes]:
            async for event in run.events():
                yield sse_event(event)

        return SSEResponse(framed(), on_close=done)
    gone = False
    try:
        response = await cancel_on_disconnect(receive, run.result())
    except ClientGone:
        gone = True
        return client_gone_response()
    finally:
        await stream.aclose()
        done(gone)
    return Response(to_json(response), media_type="application/json")
