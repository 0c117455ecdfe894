"""`POST /v1/responses` through a real server with the `openai` SDK, on scripted models
(see parser_stack.py): output items, the event stream, tools, store and errors."""

from __future__ import annotations

import json

import openai
import pytest

from stator.llm import Tokenizer
from tests.frontend.parser_stack import (
    NO_CALL,
    NO_PARSER,
    THINK,
    THINK_TEXT,
    TOOLS,
)

FUNCTIONS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
    {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}},
]


@pytest.fixture
def client(parser_client):
    return parser_client


def last_prompt(parser_stack, model: str) -> str:
    stack, engines = parser_stack
    return Tokenizer.from_dir(stack.model_dir).decode(engines[model].requests[-1].token_ids)


def summary(response) -> list[tuple]:
    """A response's output without ids, for comparing two runs."""
    out = []
    for item in response.output:
        if item.type == "reasoning":
            out.append(("reasoning", "".join(p.text for p in item.content)))
        elif item.type == "message":
            out.append(("message", "".join(p.text for p in item.content)))
        else:
            out.append((item.type, item.name, json.loads(item.arguments)))
    return out


def test_text_input_reasoning_and_message(client):
    r = client.responses.create(model=THINK, input="Hi!")
    assert r.status == "completed"
    assert summary(r) == [
        ("reasoning", "I should greet them."),
        ("message", "Hello there, friend!"),
    ]
    assert r.output_text == "Hello there, friend!"
    assert r.usage.input_tokens > 0
    assert r.usage.output_tokens == r.usage.total_tokens - r.usage.input_tokens > 0
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens


def test_model_without_parsers_answers_its_text(client):
    r = client.responses.create(model=NO_PARSER, input="Hi!")
    assert summary(r) == [("message", THINK_TEXT)]


def test_function_calls_non_streamed(client):
    r = client.responses.create(model=TOOLS, input="Weather in Paris?", tools=FUNCTIONS)
    assert summary(r) == [
        ("reasoning", "Weather and time are needed."),
        ("message", "Let me check."),
        ("function_call", "get_weather", {"city": "Paris", "unit": "°C"}),
        ("function_call", "get_time", {"tz": "CET"}),
    ]
    assert all(i.call_id.startswith("call_") for i in r.output if i.type == "function_call")


def test_streamed_events_rebuild_the_non_streamed_response(client):
    plain = client.responses.create(model=TOOLS, input="Weather in Paris?", tools=FUNCTIONS)
    events = list(
        client.responses.create(
            model=TOOLS, input="Weather in Paris?", tools=FUNCTIONS, stream=True
        )
    )
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    for kind in (
        "response.output_item.added",
        "response.reasoning_text.delta",
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ):
        assert kind in types
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert summary(events[-1].response) == summary(plain)
    # The SDK's own accumulator agrees.
    with client.responses.stream(model=TOOLS, input="Weather in Paris?", tools=FUNCTIONS) as stream:
        final = stream.get_final_response()
    assert summary(final) == summary(plain)


def test_instructions_and_previous_response_id(client, parser_stack):
    first = client.responses.create(model=THINK, input="First question", instructions="Be kind.")
    assert "Be kind." in last_prompt(parser_stack, THINK)
    second = client.responses.create(
        model=THINK, input="Second question", previous_response_id=first.id
    )
    prompt = last_prompt(parser_stack, THINK)
    # The earlier turn (its input and answer) comes first; its instructions do not carry.
    assert prompt.index("First question") < prompt.index("Hello there, friend!")
    assert prompt.index("Hello there, friend!") < prompt.index("Second question")
    assert "Be kind." not in prompt
    assert second.previous_response_id == first.id


def test_input_items_with_a_tool_round_trip(client, parser_stack):
    items = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 degrees"},
    ]
    r = client.responses.create(model=THINK, input=items, tools=FUNCTIONS)
    assert r.output_text == "Hello there, friend!"
    prompt = last_prompt(parser_stack, THINK)
    assert '<tool_call>{"name": "get_weather"' in prompt
    assert "Sunny, 21 degrees" in prompt


def test_max_output_tokens_makes_it_incomplete(client):
    r = client.responses.create(model=THINK, input="Hi", max_output_tokens=3)
    assert r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.usage.output_tokens == 3


def test_required_tool_choice_without_a_call(client):
    with pytest.raises(openai.InternalServerError) as info:
        client.responses.create(model=NO_CALL, input="Hi", tools=FUNCTIONS, tool_choice="required")
    assert info.value.body["type"] == "model_error"
    events = list(
        client.responses.create(
            model=NO_CALL, input="Hi", tools=FUNCTIONS, tool_choice="required", stream=True
        )
    )
    assert events[-1].type == "response.failed"
    assert "required" in events[-1].response.error.message


def test_store_false_and_unknown_previous_response(client):
    r = client.responses.create(model=THINK, input="Hi", store=False)
    for previous in (r.id, "resp_unknown"):
        with pytest.raises(openai.NotFoundError) as info:
            client.responses.create(model=THINK, input="Again", previous_response_id=previous)
        assert info.value.body["param"] == "previous_response_id"


@pytest.mark.parametrize(
    ("kw", "param"),
    [
        ({"input": [{"type": "image_generation_call"}]}, "input[0].type"),
        ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "Hi", "tool_choice": {"type": "mcp"}}, "tool_choice"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": "Hi", "temperature": 5}, "temperature"),
    ],
)
def test_bad_requests_are_400s_naming_the_parameter(client, kw, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=THINK, **kw)
    assert info.value.body["param"] == param


def test_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="no/such-model", input="Hi")


def test_route_is_in_the_openapi_document(parser_stack):
    import httpx

    document = httpx.get(parser_stack[0].base_url + "/openapi.json", timeout=30).json()
    assert "/v1/responses" in document["paths"]
    assert "ResponsesRequest" in document["components"]["schemas"]
