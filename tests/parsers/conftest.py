"""Fixtures for the Harmony tests: the real o200k_harmony vocabulary, built offline."""

from __future__ import annotations

import os

import pytest

from tests.parsers.harmony_vocab import VocabUnavailable, o200k_harmony_tokenizer_json


@pytest.fixture(scope="session")
def harmony_tokenizer():
    """The GPT-OSS tokenizer (tokenizers.Tokenizer), or a skip that says why not."""
    from tokenizers import Tokenizer

    try:
        path = o200k_harmony_tokenizer_json()
    except VocabUnavailable as exc:
        pytest.skip(f"o200k_harmony vocabulary cannot be built offline: {exc}")
    return Tokenizer.from_file(str(path))


@pytest.fixture(scope="session")
def reference_encoding(harmony_tokenizer):
    """openai-harmony's encoding, pointed at the offline vocabulary (no download)."""
    harmony = pytest.importorskip("openai_harmony", reason="openai-harmony is not installed")
    from tests.parsers.harmony_vocab import o200k_base_file

    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(o200k_base_file().parent)
    try:
        return harmony.load_harmony_encoding(harmony.HarmonyEncodingName.HARMONY_GPT_OSS)
    except Exception as exc:  # the Rust side raises its own HarmonyError
        pytest.skip(f"openai-harmony could not load the offline vocabulary: {exc}")
