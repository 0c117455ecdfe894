"""Reasoning parsers: a corpus per format, non-streamed and streamed under any chunking."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stator.parsers.reasoning import (
    ReasoningDelta,
    get_reasoning_parser,
    parse_reasoning,
    reasoning_parser_names,
)
from tests.parsers.chunking import chunkings, every_split_in_two

THINK = ("<think>", "</think>")
CALL = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
HARMONY = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>")

# (parser, options, output, reasoning, content, markers that must never reach content)
CASES = [
    ("deepseek_r1", {}, "<think>Let me add.</think>It is 4.", "Let me add.", "It is 4.", THINK),
    (
        "deepseek_r1",
        {},
        "Template opened it.\n</think>\n\n4",
        "Template opened it.\n",
        "\n\n4",
        THINK,
    ),
    ("deepseek_r1", {}, "\n<think>\nhmm\n</think>\nok", "\nhmm\n", "\nok", THINK),
    ("deepseek_r1", {}, "<think>cut off mid-thou", "cut off mid-thou", "", THINK),
    ("deepseek_r1", {}, "never closed", "never closed", "", THINK),
    ("deepseek_r1", {}, "<think></think>", "", "", THINK),
    ("deepseek_r1", {}, "<think>a < b, </thin k></think>x<y", "a < b, </thin k>", "x<y", THINK),
    ("deepseek_r1", {}, "<thi", "<thi", "", THINK),
    ("deepseek_r1", {}, "r</think>", "r", "", THINK),
    ("deepseek_r1", {}, "思考中…</think>答え：4", "思考中…", "答え：4", THINK),
    ("qwen3", {}, "<think>\nplan\n</think>\n\nanswer", "\nplan\n", "\n\nanswer", THINK),
    ("qwen3", {"enable_thinking": True}, "plan</think>answer", "plan", "answer", THINK),
    ("qwen3", {"enable_thinking": False}, "just an answer", "", "just an answer", THINK),
    # Qwen3 ends reasoning at a tool call, closed or not (as vLLM's Qwen3 parser does);
    # DeepSeek-R1 does not.
    ("qwen3", {}, CALL, "", CALL, ("</think>",)),
    ("qwen3", {}, f"Let me check.{CALL}", "Let me check.", CALL, ("</think>",)),
    ("qwen3", {}, f"<think>Oslo.{CALL}\nmore", "Oslo.", f"{CALL}\nmore", ("</think>",)),
    ("qwen3", {}, f"<think>a</think>b{CALL}", "a", f"b{CALL}", THINK),
    ("qwen3", {}, "<think>a <tool_ca", "a <tool_ca", "", THINK),
    ("deepseek_r1", {}, f"x{CALL}", f"x{CALL}", "", THINK),
    (
        "qwen3",
        {"chat_template_kwargs": {"enable_thinking": False}},
        "no <think> parsing",
        "",
        "no <think> parsing",
        (),
    ),
    (
        "gpt_oss",
        {},
        "<|channel|>analysis<|message|>User wants 2+2.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>4<|return|>",
        "User wants 2+2.",
        "4",
        HARMONY,
    ),
    (
        "gpt_oss",
        {},
        "<|channel|>analysis<|message|>Need a tool.<|end|><|start|>assistant<|channel|>commentary"
        ' to=functions.f <|constrain|>json<|message|>{"a":1}<|call|>',
        "Need a tool.",
        "",
        HARMONY,
    ),
    (
        "gpt_oss",
        {},
        "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary<|message|>"
        "Let me look.<|end|><|start|>assistant<|channel|>final<|message|>Done.",
        "a",
        "Let me look.Done.",
        HARMONY,
    ),
    ("gpt_oss", {}, "<|channel|>analysis<|message|>cut sho", "cut sho", "", HARMONY),
    ("gpt_oss", {}, "<|channel|>fin", "", "", HARMONY),
    ("gpt_oss", {}, "plain text, no harmony", "", "plain text, no harmony", HARMONY),
]

IDS = [f"{i}-{case[0]}" for i, case in enumerate(CASES)]


def stream(name: str, options: dict, chunks: list[str]) -> list[ReasoningDelta]:
    parser = get_reasoning_parser(name, **options)
    return [parser.feed(chunk) for chunk in chunks] + [parser.finish()]


def total(deltas: list[ReasoningDelta]) -> ReasoningDelta:
    out = ReasoningDelta()
    for delta in deltas:
        out = out + delta
    return out


@pytest.mark.parametrize(
    ("name", "options", "text", "reasoning", "content", "markers"), CASES, ids=IDS
)
def test_non_streamed(name, options, text, reasoning, content, markers):
    result = parse_reasoning(get_reasoning_parser(name, **options), text)
    assert result == ReasoningDelta(reasoning, content)


@pytest.mark.parametrize(
    ("name", "options", "text", "reasoning", "content", "markers"), CASES, ids=IDS
)
def test_every_two_way_split_and_char_by_char(name, options, text, reasoning, content, markers):
    for chunks in [*every_split_in_two(text), list(text)]:
        deltas = stream(name, options, chunks)
        assert total(deltas) == ReasoningDelta(reasoning, content), chunks
        for delta in deltas:
            assert not any(m in delta.content for m in markers)


@pytest.mark.parametrize(
    ("name", "options", "text", "reasoning", "content", "markers"), CASES, ids=IDS
)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_random_rechunking(name, options, text, reasoning, content, markers, data):
    chunks = data.draw(chunkings(text))
    deltas = stream(name, options, chunks)
    assert total(deltas) == ReasoningDelta(reasoning, content)
    # No chunk ever shows part of a marker as content (partial markers are held back).
    shown = "".join(d.content for d in deltas)
    assert not any(m in shown for m in markers)


def test_registry():
    assert {"deepseek_r1", "qwen3", "gpt_oss"} <= set(reasoning_parser_names())
    with pytest.raises(ValueError, match="unknown reasoning parser 'nope'"):
        get_reasoning_parser("nope")


def test_content_streams_before_the_end():
    parser = get_reasoning_parser("deepseek_r1")
    assert parser.feed("<think>abc") == ReasoningDelta("abc", "")
    assert parser.feed("</thi") == ReasoningDelta("", "")
    assert parser.feed("nk>ans") == ReasoningDelta("", "ans")
