"""Streaming detokenization equals decoding the whole sequence, however the ids are split."""

from __future__ import annotations

import itertools

import pytest
import tokenizers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, decoders

from stator.llm.detokenizer import IncrementalDetokenizer
from stator.llm.tokenizer import Tokenizer
from tests.llm.sentencepiece_style import make_byte_fallback_dir

TEXT_ALPHABET = st.sampled_from(
    list("abcdefgh xyz\n\t.,:()=_") + list("你好世界日本語") + ["🎉", "👍", "é", "ß", "€", "\u200d"]
)
TEXTS = st.text(TEXT_ALPHABET, min_size=0, max_size=60)
SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(
    scope="module", params=["byte_level", "byte_level_added", "byte_fallback", "metaspace"]
)
def tokenizer(request, tiny_model_dir, tmp_path_factory):
    if request.param == "byte_level":
        return Tokenizer.from_dir(tiny_model_dir)
    if request.param == "byte_level_added":
        # Added tokens outside the byte alphabet, special or not, and one whose
        # characters are byte-alphabet characters (decoded as bytes: invalid UTF-8).
        inner = tokenizers.Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
        inner.add_special_tokens([AddedToken("<｜end▁of▁sentence｜>", special=True)])
        inner.add_tokens([AddedToken("ÄĠé", special=False), AddedToken("  ", special=False)])
        tok = Tokenizer(inner, eos_token="<｜end▁of▁sentence｜>")
        assert tok.byte_level_table() is not None
        return tok
    tok = Tokenizer.from_dir(make_byte_fallback_dir(tmp_path_factory.mktemp("bf")))
    if request.param == "metaspace":
        # T5 / older SentencePiece conversions: one Metaspace decoder (strips the first
        # token's leading space), no byte fallback.
        tok.inner.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    assert tok.byte_level_table() is None  # the windowed path
    return tok


def _ascii_byte(tokenizer: Tokenizer, token_id: int) -> int:
    """A ByteFallback `<0xXX>` token with XX >= 0x80 becomes `<0x(XX-0x80)>`. A run of byte
    tokens that is not valid UTF-8 decodes (whole) to U+FFFD for every byte of the run,
    even the ASCII ones before the bad byte; a stream has shown those already (see
    test_an_invalid_byte_run_streams_its_valid_bytes). Random ids would hit that often
    (the test was flaky); valid multi-byte runs are covered by the text tests."""
    piece = tokenizer.id_to_token(token_id) or ""
    if len(piece) == 6 and piece.startswith("<0x") and int(piece[3:5], 16) >= 0x80:
        ascii_id = tokenizer.token_to_id(f"<0x{int(piece[3:5], 16) - 0x80:02X}>")
        return token_id if ascii_id is None else ascii_id
    return token_id


def split(ids: list[int], cuts: list[int]) -> list[list[int]]:
    points = sorted({c % (len(ids) + 1) for c in cuts} | {0, len(ids)})
    return [ids[a:b] for a, b in itertools.pairwise(points)]


def stream(detok: IncrementalDetokenizer, chunks: list[list[int]]) -> str:
    out = "".join(detok.add(chunk) for chunk in chunks)
    out += detok.flush()
    assert out == detok.text
    return out


@SETTINGS
@given(text=TEXTS, cuts=st.lists(st.integers(0, 200), max_size=20))
def test_streamed_text_equals_whole_decode(tokenizer, text, cuts):
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.add(chunk) for chunk in split(ids, cuts)]
    # Nothing is emitted mid-character, and nothing is held back once the text is whole.
    assert all("\ufffd" not in p for p in pieces)
    assert detok.flush() == ""
    assert "".join(pieces) == tokenizer.decode(ids)


@SETTINGS
@given(data=st.data(), cuts=st.lists(st.integers(0, 200), max_size=20))
def test_random_ids_including_specials_and_broken_bytes(tokenizer, data, cuts):
    ids = data.draw(st.lists(st.integers(0, tokenizer.vocab_size - 1), max_size=40))
    ids = [_ascii_byte(tokenizer, t) for t in ids]
    for skip in (True, False):
        detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip)
        assert stream(detok, split(ids, cuts)) == tokenizer.decode(ids, skip_special_tokens=skip)


@SETTINGS
@given(prompt=TEXTS, text=TEXTS, cuts=st.lists(st.integers(0, 200), max_size=20))
def test_with_prompt_context_matches_decoding_prompt_plus_output(tokenizer, prompt, text, cuts):
    prompt_ids = [*tokenizer.encode(prompt), *sorted(tokenizer.special_ids)[:2]]
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer, prompt_ids=prompt_ids)
    got = stream(detok, split(ids, cuts))
    visible_prompt = [t for t in prompt_ids if t not in tokenizer.special_ids]
    whole = tokenizer.decode(visible_prompt + ids)
    assert whole.endswith(got)
    assert tokenizer.decode(visible_prompt) + got == whole


def test_space_after_a_special_token_is_kept(tokenizer):
    # SentencePiece style: "▁there" after an invisible </s> must keep its space (decoding
    # from the special token on would strip it as the "first" token of the string).
    eos = tokenizer.eos_token_ids[0]
    second = "there" if tokenizer.id_to_token(eos) == "</s>" else " there"
    ids = [*tokenizer.encode("Hi"), eos, *tokenizer.encode(second)]
    detok = IncrementalDetokenizer(tokenizer)
    assert stream(detok, [[i] for i in ids]) == tokenizer.decode(ids) == "Hi there"


def test_multibyte_character_is_never_split(tokenizer):
    ids = tokenizer.encode("🎉")
    if tokenizer.decode(ids) != "🎉":
        pytest.skip("this decoder shows byte tokens literally (no byte fallback)")
    assert len(ids) > 1  # the emoji spans several tokens
    detok = IncrementalDetokenizer(tokenizer)
    assert [detok.add([i]) for i in ids] == [""] * (len(ids) - 1) + ["🎉"]


def test_long_stream_compacts_and_stays_correct(tokenizer):
    text = "the quick brown fox 你好 " * 200
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer)
    assert stream(detok, [[i] for i in ids]) == tokenizer.decode(ids)
    assert len(detok._ids) < 300  # dead ids were dropped


def test_an_invalid_byte_run_streams_its_valid_bytes(tmp_path):
    # ByteFallback decodes the run <0x72><0xEF> as a whole: invalid, so "\ufffd\ufffd". A
    # stream shows "r" as soon as it is complete (it cannot know a bad byte follows), then
    # "\ufffd" for the unfinished one.
    tok = Tokenizer.from_dir(make_byte_fallback_dir(tmp_path))
    ids = [tok.token_to_id("<0x72>"), tok.token_to_id("<0xEF>")]
    detok = IncrementalDetokenizer(tok)
    assert stream(detok, [[i] for i in ids]) == "r\ufffd"
    assert tok.decode(ids) == "\ufffd\ufffd"
