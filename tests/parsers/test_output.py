"""Reasoning and tool-call parsers chained per response (and Harmony as one parser)."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stator.parsers import OutputParser
from stator.parsers.calls import assemble_calls
from tests.parsers.chunking import chunkings

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]

CASES = [
    (
        ("qwen3", "hermes"),
        '<think>\nNeed weather.\n</think>\n\nChecking.<tool_call>{"name": "get_weather", '
        '"arguments": {"city": "Oslo"}}</tool_call>',
        ("\nNeed weather.\n", "\n\nChecking.", [("get_weather", {"city": "Oslo"})]),
    ),
    (  # a call ends Qwen3's reasoning though the think block was never closed
        ("qwen3", "hermes"),
        'Need weather.<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>',
        ("Need weather.", "", [("get_weather", {"city": "Oslo"})]),
    ),
    (
        ("deepseek_r1", "deepseek_v3"),
        "Think.</think>Answer.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
        'get_weather\n```json\n{"city": "Rome"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        ("Think.", "Answer.", [("get_weather", {"city": "Rome"})]),
    ),
    (
        ("gpt_oss", "harmony"),
        "<|channel|>analysis<|message|>Call it.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.get_weather <|constrain|>json<|message|>{"city":"SF"}<|call|>',
        ("Call it.", "", [("get_weather", {"city": "SF"})]),
    ),
    (
        ("gpt_oss", None),
        "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|message|>Hi!",
        ("Hm.", "Hi!", []),
    ),
    ((None, "hermes"), "plain", ("", "plain", [])),
    ((None, None), "<tool_call>raw</tool_call>", ("", "<tool_call>raw</tool_call>", [])),
]


def make(names, **kw) -> OutputParser:
    counter = itertools.count()
    return OutputParser(*names, tools=TOOLS, id_factory=lambda: f"call_{next(counter)}", **kw)


def result(reasoning, content, calls):
    return reasoning, content, [(c.name, json.loads(c.arguments_json)) for c in calls]


@pytest.mark.parametrize(("names", "text", "expected"), CASES)
def test_non_streamed(names, text, expected):
    assert result(*make(names).parse(text)) == expected


@pytest.mark.parametrize(("names", "text", "expected"), CASES)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_streamed_equals_non_streamed(names, text, expected, data):
    parser = make(names)
    deltas = [parser.feed(chunk) for chunk in data.draw(chunkings(text))] + [parser.finish()]
    reasoning = "".join(d.reasoning for d in deltas)
    content = "".join(d.content for d in deltas)
    calls = assemble_calls([c for d in deltas for c in d.calls])
    assert result(reasoning, content, calls) == expected


def test_tool_choice_none_leaves_text_as_content():
    text = '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    assert make(("qwen3", "hermes"), tool_choice="none").parse(text)[2] == []
    assert OutputParser(None, "hermes", tools=None).parse(text) == ("", text, [])


def test_reasoning_options_reach_the_parser():
    parser = make(("qwen3", None), reasoning_options={"enable_thinking": False})
    assert parser.parse("no thinking</think>here") == ("", "no thinking</think>here", [])
