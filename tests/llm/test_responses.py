"""Responses API translation: input → chat messages, parsed deltas → the documented events,
checked against the official `openai` SDK's own types and stream accumulator."""

from __future__ import annotations

import itertools
import json

import httpx
import pytest
from openai import OpenAI
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from stator.llm.responses import (
    InMemoryResponseStore,
    ResponseBuilder,
    ResponsesInputError,
    ResponseUsage,
    UnknownResponseError,
    continue_conversation,
    input_to_messages,
    output_text,
    output_to_messages,
    tool_choice_to_chat,
    tools_to_chat,
)
from stator.parsers.calls import ToolCallDelta
from stator.parsers.tool_calls import get_tool_call_parser

EVENT = TypeAdapter(ResponseStreamEvent)


def builder(**kw) -> ResponseBuilder:
    counter = itertools.count()
    return ResponseBuilder(
        "gpt-oss",
        response_id="resp_1",
        created_at=1700000000,
        request_echo={"tools": [], "tool_choice": "auto", "parallel_tool_calls": True},
        id_factory=lambda prefix: f"{prefix}_{next(counter)}",
        **kw,
    )


def scripted(b: ResponseBuilder, steps, **finish) -> list[dict]:
    events = b.start()
    for reasoning, content, calls in steps:
        events += b.add(reasoning, content, calls)
    return events + b.finish(ResponseUsage(12, 30, cached_tokens=4, reasoning_tokens=9), **finish)


CALL_STEPS = [
    ("Need ", "", []),
    ("weather.", "", []),
    ("", "", [ToolCallDelta(0, "call_a", "get_weather", "")]),
    ("", "", [ToolCallDelta(0, None, None, '{"city":')]),
    ("", "", [ToolCallDelta(0, None, None, ' "Paris"}')]),
]
TEXT_STEPS = [("Easy.", "", []), ("", "It is ", []), ("", "4.", [])]


def test_event_sequence_for_reasoning_then_text():
    events = scripted(builder(), TEXT_STEPS)
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert output_text(final) == "It is 4."
    assert final["usage"]["total_tokens"] == 42
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == 9


@pytest.mark.parametrize("steps", [TEXT_STEPS, CALL_STEPS])
def test_every_event_and_the_response_validate_against_the_sdk_types(steps):
    b = builder()
    for event in scripted(b, steps):
        EVENT.validate_python(event)
    Response.model_validate(b.response)


def test_function_call_events_and_result():
    b = builder()
    events = scripted(b, CALL_STEPS)
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert "".join(deltas) == '{"city": "Paris"}'
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert done["arguments"] == '{"city": "Paris"}'
    call = b.response["output"][1]
    assert (call["type"], call["call_id"], call["name"], call["status"]) == (
        "function_call",
        "call_a",
        "get_weather",
        "completed",
    )


def test_truncated_output_is_incomplete():
    events = scripted(builder(), TEXT_STEPS, incomplete_reason="max_output_tokens")
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    Response.model_validate(events[-1]["response"])


def test_arguments_before_a_name_are_an_error():
    with pytest.raises(ValueError, match="before the call's name"):
        builder().add(calls=[ToolCallDelta(0, None, None, "{}")])


def sse(events: list[dict]) -> bytes:
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)


def sdk_client(body: bytes, content_type: str) -> OpenAI:
    """The real SDK over an in-memory transport (no socket): it parses our bytes as it would
    parse a server's."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body, headers={"content-type": content_type})

    return OpenAI(
        api_key="unused",
        base_url="http://stator.invalid/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )


def test_sdk_stream_rebuilds_the_same_response_as_non_streaming():
    """Model output parsed by the hermes parser, streamed char by char through the builder."""
    output = (
        'Checking.<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    )
    parser = get_tool_call_parser("hermes", id_factory=lambda: "call_x")
    b = builder()
    events = b.start()
    for char in output:
        delta = parser.feed(char)
        events += b.add(content=delta.content, calls=delta.calls)
    delta = parser.finish()
    events += b.add(content=delta.content, calls=delta.calls)
    events += b.finish(ResponseUsage(5, 20))

    client = sdk_client(sse(events), "text/event-stream")
    with client.responses.stream(model="gpt-oss", input="weather?") as stream:
        seen = [event.type for event in stream]
        streamed = stream.get_final_response()
    non_streamed = sdk_client(json.dumps(b.response).encode(), "application/json").responses.create(
        model="gpt-oss", input="weather?"
    )
    assert seen[-1] == "response.completed"
    assert streamed.output_text == non_streamed.output_text == "Checking."
    calls = [(i.call_id, i.name, i.arguments) for i in streamed.output if i.type == "function_call"]
    assert calls == [("call_x", "get_weather", '{"city": "Oslo"}')]
    assert calls == [
        (i.call_id, i.name, i.arguments) for i in non_streamed.output if i.type == "function_call"
    ]


# -- input ---------------------------------------------------------------------------------


def test_string_input_and_instructions():
    assert input_to_messages("hi", "be nice") == [
        {"role": "system", "content": "be nice"},
        {"role": "user", "content": "hi"},
    ]


def test_items_with_a_tool_round_trip():
    items = [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Weather "},
                {"type": "input_text", "text": "in Rome?"},
            ],
        },
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "Use tool."}],
        },
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "get_weather",
            "arguments": '{"city":"Rome"}',
        },
        {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": '{"temp":25}'},
        {"type": "function_call_output", "call_id": "c2", "output": "noon"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "25C at noon."}],
        },
    ]
    assert input_to_messages(items) == [
        {"role": "user", "content": "Weather in Rome?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning": "Use tool.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"temp":25}'},
        {"role": "tool", "tool_call_id": "c2", "content": "noon"},
        {"role": "assistant", "content": "25C at noon."},
    ]


@pytest.mark.parametrize(
    ("input_", "param"),
    [
        (None, "input"),
        (42, "input"),
        (["text"], "input[0]"),
        ([{"role": "robot", "content": "x"}], "input[0].role"),
        ([{"role": "user", "content": [{"type": "input_image"}]}], "input[0].content[0]"),
        ([{"type": "function_call", "call_id": "c", "arguments": "{}"}], "input[0].name"),
        (
            [{"type": "function_call", "name": "f", "call_id": "c", "arguments": {}}],
            "input[0].arguments",
        ),
        ([{"type": "function_call_output", "output": "x"}], "input[0]"),
        ([{"type": "web_search_call"}], "input[0].type"),
    ],
)
def test_bad_input_names_the_param(input_, param):
    with pytest.raises(ResponsesInputError) as info:
        input_to_messages(input_)
    assert info.value.param == param


def test_tools_and_tool_choice():
    tools = [
        {
            "type": "function",
            "name": "f",
            "description": "d",
            "parameters": {"type": "object"},
            "strict": True,
        }
    ]
    assert tools_to_chat(tools) == [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {"type": "object"},
                "description": "d",
                "strict": True,
            },
        }
    ]
    assert tool_choice_to_chat({"type": "function", "name": "f"}) == {
        "type": "function",
        "function": {"name": "f"},
    }
    assert tool_choice_to_chat("required") == "required"
    with pytest.raises(ResponsesInputError, match="only function tools"):
        tools_to_chat([{"type": "web_search"}])
    with pytest.raises(ResponsesInputError):
        tool_choice_to_chat({"type": "function"})


# -- store ---------------------------------------------------------------------------------


def test_previous_response_continues_the_conversation():
    store = InMemoryResponseStore(max_entries=2)
    b = builder()
    scripted(b, [*TEXT_STEPS[:1], *CALL_STEPS[2:]])
    first_messages = [{"role": "user", "content": "weather?"}]
    store.put("resp_1", first_messages, b.response)
    follow_up = [{"role": "tool", "tool_call_id": "call_a", "content": "sunny"}]
    assert continue_conversation(store, "resp_1", follow_up) == [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning": "Easy.",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
    ]
    assert output_to_messages({"output": []}) == []


def test_store_is_bounded_and_unknown_ids_are_clear_errors():
    store = InMemoryResponseStore(max_entries=2)
    for i in range(3):
        store.put(f"r{i}", [], {"output": []})
    assert len(store) == 2
    with pytest.raises(UnknownResponseError, match="no stored response with id 'r0'"):
        continue_conversation(store, "r0", [])
    with pytest.raises(ValueError):
        InMemoryResponseStore(max_entries=0)
