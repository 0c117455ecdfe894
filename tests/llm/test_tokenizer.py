from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stator.llm.tokenizer import OFF_LOOP_CHARS, Tokenizer, TokenizerError, read_model_files
from tests.model_factory import SPECIAL_TOKENS, make_model_dir


def test_from_dir_reads_special_tokens_and_eos(tiny_model_dir):
    tok = Tokenizer.from_dir(tiny_model_dir)
    assert tok.bos_token == "<s>" and tok.eos_token == "<|im_end|>"
    assert tok.eos_token_ids == [SPECIAL_TOKENS.index("<|im_end|>")]
    assert tok.special_ids == set(range(len(SPECIAL_TOKENS)))
    assert tok.vocab_size >= 2000
    assert tok.token_to_id("<|im_start|>") == 4 and tok.id_to_token(4) == "<|im_start|>"
    assert tok.model_max_length == 2048


def test_round_trip_and_special_skipping(tiny_model_dir):
    tok = Tokenizer.from_dir(tiny_model_dir)
    text = "def f(x):\n    return x + 1  # 你好 🎉"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    with_special = [*ids, tok.eos_token_ids[0]]
    assert tok.decode(with_special) == text
    assert tok.decode(with_special, skip_special_tokens=False) == text + "<|im_end|>"


def test_from_files_equals_from_dir(tiny_model_dir):
    a = Tokenizer.from_dir(tiny_model_dir)
    b = Tokenizer.from_files(read_model_files(tiny_model_dir))
    assert a.encode("hello world") == b.encode("hello world")
    assert a.eos_token_ids == b.eos_token_ids


def test_eos_ids_merge_generation_config_lists(tmp_path):
    path = make_model_dir(tmp_path)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 2, 5]}))
    assert Tokenizer.from_dir(path).eos_token_ids == [5, 2]


def test_missing_or_broken_files_raise_clear_errors(tmp_path):
    with pytest.raises(TokenizerError, match="not found"):
        Tokenizer.from_dir(tmp_path / "nope")
    with pytest.raises(TokenizerError, match=r"tokenizer\.json is missing"):
        Tokenizer.from_files({})
    with pytest.raises(TokenizerError, match="cannot be loaded"):
        Tokenizer.from_files({"tokenizer.json": b"{not json"})
    path = make_model_dir(tmp_path / "m")
    files = read_model_files(path)
    files["tokenizer_config.json"] = b"[1, 2]"
    with pytest.raises(TokenizerError, match="JSON object"):
        Tokenizer.from_files(files)


def test_token_info_gives_text_and_exact_bytes(tiny_model_dir, tmp_path):
    from tests.llm.sentencepiece_style import make_byte_fallback_dir

    for tok in (
        Tokenizer.from_dir(tiny_model_dir),
        Tokenizer.from_dir(make_byte_fallback_dir(tmp_path)),
    ):
        ids = tok.encode(" hello 你好")
        infos = [tok.token_info(i) for i in ids]
        assert b"".join(bytes(raw) for _, raw in infos).lstrip(
            b" "
        ) == " hello 你好".encode().lstrip(b" ")
        # A word piece keeps its leading space even for SentencePiece's "▁hello".
        assert any(text.startswith(" h") for text, _ in infos)
        assert tok.token_info(tok.eos_token_ids[0])[0] == tok.eos_token
        assert tok.token_info(ids[0]) is tok.token_info(ids[0])  # cached


async def test_encode_async_matches_encode_short_and_long(tiny_model_dir):
    tok = Tokenizer.from_dir(tiny_model_dir)
    short = "hello world"
    long = "the quick brown fox jumps over the lazy dog. " * (OFF_LOOP_CHARS // 40)
    assert len(long) >= OFF_LOOP_CHARS
    for text in (short, long):
        for special in (False, True):
            assert await tok.encode_async(text, special) == tok.encode(text, special)


async def test_long_encode_leaves_the_event_loop_free(tiny_model_dir):
    """A long prompt is tokenized in a thread: a task on the loop keeps ticking meanwhile
    (inline, the loop would not turn until the encode returned)."""
    tok = Tokenizer.from_dir(tiny_model_dir)
    text = "the quick brown fox jumps over the lazy dog. " * 20_000  # ~1 MB, ~0.1-1 s
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    before = ticks
    ids = await tok.encode_async(text)
    during = ticks - before
    ticker.cancel()
    assert ids == tok.encode(text)
    assert during > 10


# Texts where a shortcut in encoding would show: multi-byte characters, whitespace runs,
# special-token strings (whole, adjacent, broken), control characters, the empty string.
VARIED_TEXTS = [
    "",
    " ",
    "hello world",
    "  leading and trailing spaces   ",
    "tabs\tand\nnewlines\r\n\n\n  \t mixed",
    "你好，世界！ こんにちは 안녕하세요 Привет мир",
    "emoji 🎉🎉 👩‍👩‍👧 flags 🇫🇷 and combining é (e\u0301)",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<s></s><pad><unk><|im_end|><|im_end|>",
    "almost special: <|im_start| <|im_end |> < s> <|im_start|><|im_star",
    "def f(x):\n    return x ** 2  # comment\n\n\nclass A: pass",
    "\x00\x01 control \u200b zero width \ufeff bom",
    "1234567890 3.14159 -42 0x1f 1e-9",
]


@pytest.fixture(scope="module")
def both_tokenizers(tmp_path_factory):
    from tests.llm.sentencepiece_style import make_byte_fallback_dir

    base = tmp_path_factory.mktemp("tokenizers")
    return [
        Tokenizer.from_dir(make_model_dir(base / "byte_level")),
        Tokenizer.from_dir(make_byte_fallback_dir(base / "byte_fallback")),
    ]


def test_encode_ids_equal_tokenizers_encode(both_tokenizers):
    """`encode` takes tokenizers' offset-free batch path: the ids must be exactly those of
    `tokenizers.Tokenizer.encode`, for byte-level and byte-fallback tokenizers alike."""
    long_prompt = " ".join(VARIED_TEXTS) * 40  # several thousand tokens
    for tok in both_tokenizers:
        for text in [*VARIED_TEXTS, long_prompt]:
            for special in (False, True):
                expected = tok.inner.encode(text, add_special_tokens=special).ids
                assert tok.encode(text, special) == expected, (text[:40], special)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    pieces=st.lists(
        st.one_of(
            st.text(max_size=30),
            st.sampled_from(["<|im_start|>", "<|im_end|>", "<s>", " ", "\n\n", "  \t"]),
        ),
        max_size=12,
    ),
    special=st.booleans(),
)
def test_encode_ids_equal_tokenizers_encode_on_random_text(both_tokenizers, pieces, special):
    text = "".join(pieces)
    for tok in both_tokenizers:
        assert tok.encode(text, special) == tok.inner.encode(text, add_special_tokens=special).ids
