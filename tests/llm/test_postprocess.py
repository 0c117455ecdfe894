"""ChoiceProcessor: streamed deltas concatenated equal the one-shot result, stop strings
spanning chunks are cut and never shown."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stator.llm.postprocess import ChoiceProcessor
from stator.llm.tokenizer import Tokenizer
from stator.protocols import EngineOutput, TokenLogprob, TopLogprob, Usage
from tests.llm.sentencepiece_style import make_byte_fallback_dir
from tests.llm.test_stop_strings import reference as stop_reference

WORDS = st.sampled_from(["the", " cat", " 你好", "🎉", " sat", "\n", " END", "E", "ND", "é", "."])
SETTINGS = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module", params=["byte_level", "byte_fallback"])
def tokenizer(request, tiny_model_dir, tmp_path_factory):
    if request.param == "byte_level":
        return Tokenizer.from_dir(tiny_model_dir)
    return Tokenizer.from_dir(make_byte_fallback_dir(tmp_path_factory.mktemp("bf")))


def outputs(ids: list[int], cuts: list[int], finish: str = "length") -> list[EngineOutput]:
    points = sorted({c % (len(ids) + 1) for c in cuts} | {0, len(ids)})
    chunks = [ids[a:b] for a, b in itertools.pairwise(points)] or [[]]
    outs = [EngineOutput(token_ids=c) for c in chunks]
    outs[-1].finish_reason = finish
    return outs


def run(processor: ChoiceProcessor, outs: list[EngineOutput]) -> tuple[str, str | None, object]:
    text = []
    for out in outs:
        delta = processor.process(out)
        text.append(delta.text)
        if delta.finish_reason is not None:
            return "".join(text), delta.finish_reason, delta.stop_reason
    raise AssertionError("no finish reason")


@SETTINGS
@given(
    words=st.lists(WORDS, max_size=25),
    stops=st.lists(st.sampled_from(["END", "好 ", "🎉", "t s", "\n\n", "cat"]), max_size=3),
    cuts=st.lists(st.integers(0, 200), max_size=20),
)
def test_streamed_equals_one_shot(tokenizer, words, stops, cuts):
    ids = tokenizer.encode("".join(words))
    streamed = run(ChoiceProcessor(tokenizer, stops), outputs(ids, cuts))
    one_shot = run(ChoiceProcessor(tokenizer, stops), outputs(ids, []))
    assert streamed == one_shot
    text, stop = stop_reference(tokenizer.decode(ids), stops, include=False)
    assert streamed[0] == text
    assert streamed[1:] == (("stop", stop) if stop else ("length", None))
    assert not any(s in streamed[0] for s in stops)


@SETTINGS
@given(words=st.lists(WORDS, max_size=25), cuts=st.lists(st.integers(0, 200), max_size=20))
def test_no_delta_ever_shows_part_of_a_stop_string_or_character(tokenizer, words, cuts):
    ids = tokenizer.encode("".join(words))
    final, _ = stop_reference(tokenizer.decode(ids), ["END"], include=False)
    processor = ChoiceProcessor(tokenizer, ["END"])
    shown = ""
    for out in outputs(ids, cuts):
        delta = processor.process(out)
        shown += delta.text
        assert "\ufffd" not in delta.text
        # What the user has seen at any moment is part of the final answer: nothing is
        # ever shown that later turns out to belong to a stop string.
        assert final.startswith(shown)
        if delta.finish_reason is not None:
            break
    assert shown == final


def test_stop_string_finishes_and_later_outputs_are_ignored(tiny_model_dir):
    tok = Tokenizer.from_dir(tiny_model_dir)
    p = ChoiceProcessor(tok, ["STOP"], prompt_token_ids=[1, 2, 3])
    first = p.process(EngineOutput(token_ids=tok.encode("hello ST"), cached_tokens=2))
    assert (first.text, first.finish_reason) == ("hello ", None)
    second = p.process(EngineOutput(token_ids=tok.encode("OP and more")))
    assert (second.text, second.finish_reason, second.stop_reason) == ("", "stop", "STOP")
    assert p.finished
    assert p.process(EngineOutput(token_ids=[10, 11])).text == ""
    usage = p.usage
    assert (usage.prompt_tokens, usage.cached_tokens) == (3, 2)
    assert usage.completion_tokens == len(tok.encode("hello ST")) + len(tok.encode("OP and more"))


def test_eos_and_visible_stop_tokens(tiny_model_dir):
    tok = Tokenizer.from_dir(tiny_model_dir)
    eos = tok.eos_token_ids[0]
    p = ChoiceProcessor(tok)
    d = p.process(
        EngineOutput(
            token_ids=tok.encode("hi"),
            finish_reason="stop",
            stop_token_id=eos,
            usage=Usage(completion_tokens=5),
        )
    )
    assert (d.text, d.finish_reason, d.stop_reason) == ("hi", "stop", None)
    assert p.usage.completion_tokens == 5  # the engine counted the hidden EOS
    visible = tok.encode(".")[0]
    p = ChoiceProcessor(tok)
    d = p.process(EngineOutput(token_ids=[visible], finish_reason="stop", stop_token_id=visible))
    assert (d.text, d.stop_reason) == (".", visible)


def test_held_back_text_is_released_at_length_and_errors_pass_through(tiny_model_dir):
    tok = Tokenizer.from_dir(tiny_model_dir)
    p = ChoiceProcessor(tok, ["</answer>"])
    assert p.process(EngineOutput(token_ids=tok.encode("x </ans"))).text == "x "
    d = p.process(EngineOutput(token_ids=[], finish_reason="length"))
    assert (d.text, d.finish_reason) == ("</ans", "length")
    p = ChoiceProcessor(tok)
    d = p.process(EngineOutput(finish_reason="error", error="boom"))
    assert (d.finish_reason, d.error) == ("error", "boom")


def test_include_stop_str_and_special_tokens_shown(tiny_model_dir):
    tok = Tokenizer.from_dir(tiny_model_dir)
    p = ChoiceProcessor(tok, ["END"], include_stop_str=True)
    assert p.process(EngineOutput(token_ids=tok.encode("a END b"))).text == "a END"
    p = ChoiceProcessor(tok, skip_special_tokens=False)
    ids = [*tok.encode("a"), tok.eos_token_ids[0]]
    assert p.process(EngineOutput(token_ids=ids, finish_reason="length")).text == "a<|im_end|>"


def test_logprobs_are_openai_shaped(tiny_model_dir):
    tok = Tokenizer.from_dir(tiny_model_dir)
    ids = tok.encode(" hello 你")
    lps = [TokenLogprob(token_id=i, logprob=-0.5, top=[TopLogprob(i, -0.5)]) for i in ids]
    d = ChoiceProcessor(tok).process(EngineOutput(token_ids=ids, logprobs=lps))
    assert [e.token_id for e in d.logprobs] == ids
    assert b"".join(bytes(e.bytes) for e in d.logprobs) == " hello 你".encode()
    assert d.logprobs[0].token == tok.decode(ids[:1])
    assert d.logprobs[0].top[0].token == d.logprobs[0].token
    assert d.logprobs[-1].token == "\ufffd"  # the last byte of 你 alone
