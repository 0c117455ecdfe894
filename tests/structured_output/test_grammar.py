"""Specs to grammars, validation without a tokenizer, and forced tool choices."""

from __future__ import annotations

import json

import pytest

from stator.protocols import GuidedDecoding
from stator.structured_output import (
    InvalidGrammar,
    forced_tool_schema,
    parse_forced_calls,
    spec_key,
    validate,
)
from stator.structured_output.matcher import GrammarCompiler
from tests.model_factory import tokenizer_json

TOOLS = [
    {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "b"}},
]


@pytest.mark.parametrize(
    "spec",
    [
        GuidedDecoding(json_schema={"type": "object", "properties": {"x": {"type": "integer"}}}),
        GuidedDecoding(json_object=True),
        GuidedDecoding(regex=r"[a-z]+\d"),
        GuidedDecoding(choice=["a.b", "(c)|d", "e\\f"]),
        GuidedDecoding(grammar='root ::= "a" | "b"'),
        GuidedDecoding(grammar='start: "a" "b"?'),
        GuidedDecoding(json_schema={"type": "object"}, whitespace_pattern=r"[ ]?"),
    ],
)
def test_valid_specs_validate(spec):
    validate(spec)


@pytest.mark.parametrize(
    ("spec", "param"),
    [
        (GuidedDecoding(json_schema={"type": "nope"}), "guided_json"),
        (GuidedDecoding(regex="(a"), "guided_regex"),
        (GuidedDecoding(grammar="start: b"), "guided_grammar"),
        (GuidedDecoding(grammar="root ::= ???"), "guided_grammar"),
        (GuidedDecoding(choice=[]), "guided_choice"),
    ],
)
def test_invalid_specs_name_their_field(spec, param):
    with pytest.raises(InvalidGrammar) as info:
        validate(spec)
    assert info.value.param == param and param in info.value.message
    with pytest.raises(InvalidGrammar) as info:
        validate(spec, "response_format")
    assert info.value.param == "response_format"


def test_choice_literals_are_matched_exactly():
    compiler = GrammarCompiler(tokenizer_json(), 2006, [5])
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer_json())
    spec = GuidedDecoding(choice=["a.b", "(c)|d"])
    for text, ok in [("a.b", True), ("axb", False), ("(c)|d", True), ("c", False)]:
        m = compiler.matcher(spec)
        consumed = all(m.consume_token(t) for t in tok.encode(text).ids)
        assert (consumed and m.is_accepting()) is ok, text


def test_spec_key_is_order_independent():
    a = GuidedDecoding(json_schema={"a": 1, "b": 2})
    b = GuidedDecoding(json_schema={"b": 2, "a": 1})
    assert spec_key(a) == spec_key(b)
    assert spec_key(a) != spec_key(GuidedDecoding(json_schema={"a": 1}))


def test_forced_tool_schemas():
    assert forced_tool_schema(TOOLS, "auto") is None
    assert forced_tool_schema(None, "required") is None
    named = {"type": "function", "function": {"name": "b"}}
    assert forced_tool_schema(TOOLS, named) == {"type": "object"}
    schema = forced_tool_schema(TOOLS, "required")
    assert schema["minItems"] == 1 and len(schema["items"]["anyOf"]) == 2
    validate(GuidedDecoding(json_schema=schema))


def test_forced_calls_read_back():
    named = {"type": "function", "function": {"name": "b"}}
    assert parse_forced_calls('{"x": 1}', named) == [("b", '{"x": 1}')]
    calls = parse_forced_calls(
        '[{"name": "a", "parameters": {}}, {"name": "b", "parameters": {"y": "z"}}]', "required"
    )
    assert calls == [("a", "{}"), ("b", json.dumps({"y": "z"}))]
    for bad in ("[]", '{"x"', '[{"parameters": {}}]'):
        with pytest.raises(ValueError):
            parse_forced_calls(bad, "required")
