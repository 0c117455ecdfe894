"""Tool-call parsers: the corpus non-streamed and streamed under any chunking."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stator.parsers.tool_calls import (
    ToolCall,
    ToolChoiceError,
    assemble_calls,
    get_tool_call_parser,
    tool_call_parser_names,
    validate_tool_choice,
)
from tests.parsers.chunking import chunkings, every_split_in_two
from tests.parsers.tool_call_corpus import CASES, MARKERS, QWEN_TOOLS

IDS = [f"{i}-{case[0]}" for i, case in enumerate(CASES)]


def make_parser(name: str):
    counter = itertools.count()
    tools = QWEN_TOOLS if name == "qwen3_coder" else None
    return get_tool_call_parser(name, tools, id_factory=lambda: f"call_{next(counter)}")


def as_pairs(calls: list[ToolCall]) -> list[tuple[str, dict]]:
    return [(call.name, json.loads(call.arguments_json)) for call in calls]


def streamed(name: str, chunks: list[str]):
    parser = make_parser(name)
    deltas = [parser.feed(chunk) for chunk in chunks] + [parser.finish()]
    content = "".join(d.content for d in deltas)
    call_deltas = [c for d in deltas for c in d.calls]
    return deltas, content, call_deltas


def check_openai_stream_order(call_deltas) -> None:
    """Per call: the first delta carries id and name, later ones only argument fragments;
    indexes count up from 0."""
    seen: set[int] = set()
    for delta in call_deltas:
        if delta.index not in seen:
            assert delta.index == len(seen)
            assert delta.id and delta.id.startswith("call_") and delta.name
            seen.add(delta.index)
        else:
            assert delta.id is None and delta.name is None


@pytest.mark.parametrize(("name", "text", "content", "calls"), CASES, ids=IDS)
def test_non_streamed(name, text, content, calls):
    got_content, got_calls = make_parser(name).parse(text)
    assert got_content == content
    assert as_pairs(got_calls) == calls
    assert all(call.id.startswith("call_") for call in got_calls)


@pytest.mark.parametrize(("name", "text", "content", "calls"), CASES, ids=IDS)
def test_every_two_way_split_and_char_by_char(name, text, content, calls):
    expected = make_parser(name).parse(text)
    for chunks in [*every_split_in_two(text), list(text)]:
        deltas, got_content, call_deltas = streamed(name, chunks)
        assert (got_content, assemble_calls(call_deltas)) == expected, chunks
        check_openai_stream_order(call_deltas)
        for delta in deltas:
            assert not any(marker in delta.content for marker in MARKERS[name])


@pytest.mark.parametrize(("name", "text", "content", "calls"), CASES, ids=IDS)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_random_rechunking(name, text, content, calls, data):
    chunks = data.draw(chunkings(text))
    _, got_content, call_deltas = streamed(name, chunks)
    assert got_content == content
    assert as_pairs(assemble_calls(call_deltas)) == calls
    assert not any(marker in got_content for marker in MARKERS[name])
    check_openai_stream_order(call_deltas)


def test_every_format_has_cases():
    assert {case[0] for case in CASES} == set(tool_call_parser_names())


def test_unknown_parser_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown tool-call parser 'nope'"):
        get_tool_call_parser("nope")


def test_content_before_a_call_streams_immediately():
    parser = make_parser("hermes")
    assert parser.feed("Hello <tool").content == "Hello "
    assert parser.feed("_call>{").content == ""
    delta = parser.feed('"name": "f", "arguments": {}}</tool_call>')
    assert [(c.index, c.id, c.name, c.arguments_fragment) for c in delta.calls] == [
        (0, "call_0", "f", ""),
        (0, None, None, "{}"),
    ]


# -- tool_choice -----------------------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {"name": "f"}},
    {"type": "function", "function": {"name": "g"}},
]
F = ToolCall("call_1", "f", "{}")
G = ToolCall("call_2", "g", "{}")


@pytest.mark.parametrize(
    ("choice", "calls"),
    [
        ("auto", []),
        ("auto", [F]),
        (None, [G]),
        ("none", []),
        ("required", [F, G]),
        ({"type": "function", "function": {"name": "f"}}, [F]),
    ],
)
def test_tool_choice_accepts(choice, calls):
    validate_tool_choice(choice, calls, TOOLS)


@pytest.mark.parametrize(
    ("choice", "calls", "message"),
    [
        ("required", [], "called no tool"),
        ("required", [ToolCall("c", "h", "{}")], "unknown tools: h"),
        ({"type": "function", "function": {"name": "f"}}, [], "made none"),
        ({"type": "function", "function": {"name": "f"}}, [G], "called g"),
        ({"type": "function", "function": {}}, [F], "must name a function"),
        ("none", [F], "called a tool"),
        ("sometimes", [F], "unsupported tool_choice"),
    ],
)
def test_tool_choice_rejects(choice, calls, message):
    with pytest.raises(ToolChoiceError, match=message):
        validate_tool_choice(choice, calls, TOOLS)
