"""Structured output at the HTTP edge: invalid constraints are 400s naming the field, a
model whose workers cannot constrain refuses constrained requests, and a required or
named tool choice becomes a JSON-schema constraint whose output is read back as calls."""

from __future__ import annotations

import json

import openai
import pytest

from stator.llm import Tokenizer
from tests.fakes import ScriptedEngine
from tests.frontend.harness import Stack
from tests.frontend.parser_stack import TOOLS_LIST, WEATHER_TOOL

USER = [{"role": "user", "content": "Weather in Oslo?"}]
REQUIRED = "test/required-call"  # answers a JSON list of calls
NAMED = "test/named-call"  # answers an arguments object
PLAIN = "test/cannot-constrain"  # its workers cannot constrain output
NAMED_CHOICE = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    tokenizer = Tokenizer.from_dir(tiny_model_dir)
    eos = tokenizer.eos_token_ids[0]
    texts = {
        REQUIRED: '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]',
        NAMED: '{"city": "Oslo"}',
        PLAIN: "no",
    }
    stack = Stack(tiny_model_dir).start()
    engines = {}
    try:
        for i, (name, text) in enumerate(texts.items()):
            engine = ScriptedEngine(
                name,
                script=[*tokenizer.encode(text), eos],
                eos_token_id=eos,
                structured_output=name != PLAIN,
            )
            stack.add_worker(engine, f"stator.so{i}.generate", wait_model=name)
            engines[name] = engine
        yield stack, engines
    finally:
        stack.stop()


@pytest.fixture
def client(served):
    stack, _ = served
    with openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0) as c:
        yield c


def bad_request(client, **body) -> dict:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(messages=USER, max_tokens=5, **body)
    return info.value.body


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "objekt"}},
                }
            },
            "response_format",
        ),
        (
            {
                "extra_body": {
                    "guided_json": {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}
                }
            },
            "guided_json",
        ),
        ({"extra_body": {"guided_regex": "[a-"}}, "guided_regex"),
        ({"extra_body": {"guided_grammar": "start: undefined_rule"}}, "guided_grammar"),
        ({"extra_body": {"structured_outputs": {"regex": "(("}}}, "structured_outputs"),
    ],
)
def test_invalid_constraints_are_400_naming_the_field(client, fields, param):
    body = bad_request(client, model=NAMED, **fields)
    assert body["param"] == param
    assert param in body["message"]


def test_a_model_that_cannot_constrain_answers_400(client):
    body = bad_request(client, model=PLAIN, response_format={"type": "json_object"})
    assert "cannot constrain" in body["message"] and body["param"] == "response_format"
    # A required tool choice there needs a tool-call parser, as before (none here).
    body = bad_request(client, model=PLAIN, tools=TOOLS_LIST, tool_choice="required")
    assert body["param"] == "tool_choice"


def test_required_tool_choice_is_constrained_and_read_back(client, served):
    _, engines = served
    r = client.chat.completions.create(
        model=REQUIRED, messages=USER, tools=TOOLS_LIST, tool_choice="required"
    )
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    assert r.choices[0].finish_reason == "tool_calls"
    schema = engines[REQUIRED].requests[-1].sampling.guided_decoding.json_schema
    assert schema["type"] == "array" and schema["minItems"] == 1
    names = [e["properties"]["name"]["enum"] for e in schema["items"]["anyOf"]]
    assert names == [["get_weather"], ["get_time"]]


def test_named_tool_choice_is_constrained_to_its_parameters(client, served):
    _, engines = served
    r = client.chat.completions.create(
        model=NAMED, messages=USER, tools=TOOLS_LIST, tool_choice=NAMED_CHOICE
    )
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    sent = engines[NAMED].requests[-1].sampling.guided_decoding.json_schema
    assert sent == WEATHER_TOOL["function"]["parameters"]
    chunks = list(
        client.chat.completions.create(
            model=NAMED, messages=USER, tools=TOOLS_LIST, tool_choice=NAMED_CHOICE, stream=True
        )
    )
    calls = [c for chunk in chunks for c in (chunk.choices[0].delta.tool_calls or [])]
    assert calls[0].function.name == "get_weather"
    assert json.loads("".join(c.function.arguments for c in calls)) == {"city": "Oslo"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_forced_tool_choice_and_response_format_conflict(client):
    body = bad_request(
        client,
        model=NAMED,
        tools=TOOLS_LIST,
        tool_choice="required",
        response_format={"type": "json_object"},
    )
    assert body["param"] == "tool_choice"


def test_auto_tool_choice_is_not_constrained(client, served):
    _, engines = served
    client.chat.completions.create(model=NAMED, messages=USER, tools=TOOLS_LIST, max_tokens=3)
    assert engines[NAMED].requests[-1].sampling.guided_decoding is None
