"""`stator run` on the bundled model with speculative decoding, answering JSON-schema,
regex and forced tool-call requests through the openai SDK: every answer parses."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from tests.e2e.fleet import Fleet
from tests.e2e.test_stator_run import start_run

pytestmark = pytest.mark.integration

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture
def fleet(tmp_path):
    f = Fleet(tmp_path)
    yield f
    f.close()


def test_constrained_answers_from_a_speculating_native_engine(fleet):
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 3})
    proc, url = start_run(fleet, "--speculative-config", spec)
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
    messages = [{"role": "user", "content": "Describe a person."}]
    for temperature in (0.0, 1.0):
        out = client.chat.completions.create(
            model="tiny-chat",
            messages=messages,
            max_tokens=200,
            temperature=temperature,
            seed=3,
            response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
        )
        jsonschema.validate(json.loads(out.choices[0].message.content), SCHEMA)
    out = client.chat.completions.create(
        model="tiny-chat",
        messages=messages,
        max_tokens=20,
        extra_body={"guided_regex": "[0-9]{4}-[0-9]{2}"},
    )
    assert re.fullmatch("[0-9]{4}-[0-9]{2}", out.choices[0].message.content)
    out = client.chat.completions.create(
        model="tiny-chat",
        messages=messages,
        max_tokens=100,
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    (call,) = out.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert set(json.loads(call.function.arguments)) == {"city"}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny-chat", messages=messages, extra_body={"guided_regex": "(unclosed"}
        )
    assert info.value.body["param"] == "guided_regex"
    proc.signal(2)
    assert proc.wait(30) == 0
