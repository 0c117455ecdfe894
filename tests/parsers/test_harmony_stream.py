"""Harmony parsing on token ids: any chunking gives the same result, the text-level parser
agrees with the token-level one, and a tokenizer without Harmony tokens fails loudly."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stator.parsers.calls import assemble_calls
from stator.parsers.harmony import (
    HarmonyRenderer,
    HarmonyStreamParser,
    HarmonyTextParser,
    HarmonyTokenIds,
    HarmonyVocabularyError,
)

MARKERS = (
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
    "<|constrain|>",
)

# Model output after the prompt's `<|start|>assistant`: (text, reasoning, content, calls)
OUTPUTS = [
    (
        "<|channel|>analysis<|message|>Think: 2+2.<|end|><|start|>assistant<|channel|>final"
        "<|message|>4 ✅<|return|>",
        "Think: 2+2.",
        "4 ✅",
        [],
    ),
    (
        "<|channel|>analysis<|message|>Weather needed.<|end|><|start|>assistant<|channel|>"
        'commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"東京"}<|call|>',
        "Weather needed.",
        "",
        [("get_weather", '{"city":"東京"}')],
    ),
    (
        "<|channel|>commentary<|message|>One moment.<|end|><|start|>assistant to=functions.a"
        "<|channel|>commentary <|constrain|>json<|message|>{}<|call|>",
        "",
        "One moment.",
        [("a", "{}")],
    ),
    # Built-in tools run on the analysis channel: hidden, never content, never a function call.
    (
        '<|channel|>analysis to=browser.search<|message|>{"query":"x"}<|call|>',
        '{"query":"x"}',
        "",
        [],
    ),
    # Cut off inside the answer, and inside a header.
    ("<|channel|>final<|message|>Partial answ", "", "Partial answ", []),
    ("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|chan", "a", "", []),
    # A message from another role is never shown.
    ("<|channel|>final<|message|>x<|end|><|start|>user<|message|>fake user<|end|>", "", "x", []),
]


def run_tokens(tokenizer, chunks: list[list[int]]):
    counter = itertools.count()
    parser = HarmonyStreamParser(tokenizer, id_factory=lambda: f"call_{next(counter)}")
    deltas = [parser.feed(chunk) for chunk in chunks] + [parser.finish()]
    return summarize(deltas)


def run_text(chunks: list[str]):
    counter = itertools.count()
    parser = HarmonyTextParser(id_factory=lambda: f"call_{next(counter)}")
    deltas = [parser.feed(chunk) for chunk in chunks] + [parser.finish()]
    return summarize(deltas)


def summarize(deltas):
    reasoning = "".join(d.reasoning for d in deltas)
    content = "".join(d.content for d in deltas)
    calls = [
        (c.name, c.arguments_json) for c in assemble_calls([c for d in deltas for c in d.calls])
    ]
    for delta in deltas:
        assert not any(m in delta.content or m in delta.reasoning for m in MARKERS)
    return reasoning, content, calls


@pytest.mark.parametrize(("text", "reasoning", "content", "calls"), OUTPUTS)
def test_token_and_text_parsers_agree(harmony_tokenizer, text, reasoning, content, calls):
    tokens = harmony_tokenizer.encode(text, add_special_tokens=False).ids
    assert run_tokens(harmony_tokenizer, [tokens]) == (reasoning, content, calls)
    assert run_tokens(harmony_tokenizer, [[t] for t in tokens]) == (reasoning, content, calls)
    assert run_text([text]) == (reasoning, content, calls)
    assert run_text(list(text)) == (reasoning, content, calls)


@pytest.mark.parametrize(("text", "reasoning", "content", "calls"), OUTPUTS)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_random_token_chunking(harmony_tokenizer, text, reasoning, content, calls, data):
    tokens = harmony_tokenizer.encode(text, add_special_tokens=False).ids
    cuts = data.draw(st.lists(st.integers(0, len(tokens)), max_size=len(tokens)))
    points = sorted({0, len(tokens), *cuts})
    chunks = [tokens[a:b] for a, b in itertools.pairwise(points)]
    assert run_tokens(harmony_tokenizer, chunks) == (reasoning, content, calls)


def test_stop_tokens_are_return_and_call(harmony_tokenizer):
    ids = HarmonyTokenIds.from_tokenizer(harmony_tokenizer)
    assert ids.stop_token_ids == (200002, 200012)
    assert HarmonyStreamParser(harmony_tokenizer).stop_token_ids == (200002, 200012)


def test_tokenizer_without_harmony_tokens_fails_loudly(tiny_model_dir):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    with pytest.raises(
        HarmonyVocabularyError, match=r"lacks the Harmony special tokens <\|start\|>"
    ):
        HarmonyTokenIds.from_tokenizer(tokenizer)
    with pytest.raises(HarmonyVocabularyError):
        HarmonyRenderer(tokenizer)
    with pytest.raises(HarmonyVocabularyError):
        HarmonyStreamParser(tokenizer)
