from __future__ import annotations

import json

import pytest

from stator.llm.model_files import ModelFiles
from stator.llm.tokenizer import TokenizerError, read_model_files
from stator.protocols import ModelCard
from tests.model_factory import make_model_dir


def test_from_dir(tiny_model_dir):
    files = ModelFiles.from_dir(tiny_model_dir)
    assert files.context_length == 2048  # config.json max_position_embeddings
    assert files.generation_config == {"temperature": 0.7}
    assert files.eos_token_ids == [5]
    assert files.chat_template is not None
    assert "<|im_start|>user\nhi<|im_end|>" in files.chat_template.render(
        [{"role": "user", "content": "hi"}]
    )


def test_context_length_falls_back_to_tokenizer(tmp_path):
    path = make_model_dir(tmp_path, max_position_embeddings=1024)
    config = json.loads((path / "config.json").read_text())
    del config["max_position_embeddings"]
    (path / "config.json").write_text(json.dumps(config))
    assert ModelFiles.from_dir(path).context_length == 1024  # tokenizer model_max_length


def test_from_card_local_dir_and_card_overrides(tiny_model_dir):
    card = ModelCard(
        name="tiny",
        source_path=str(tiny_model_dir),
        context_length=512,
        chat_template="CARD{{ messages[0].content }}{{ eos_token }}",
        eos_token_ids=[7],
    )
    files = ModelFiles.from_card(card)
    assert files.context_length == 512
    assert files.chat_template.render([{"role": "user", "content": "x"}]) == "CARDx<|im_end|>"
    assert files.eos_token_ids == [7, 5]


def test_from_card_inline_files(tiny_model_dir):
    card = ModelCard(
        name="tiny",
        source_path="/elsewhere/on/another/host",
        files=read_model_files(tiny_model_dir),
        context_length=1000,
    )
    files = ModelFiles.from_card(card)
    assert files.tokenizer.decode(files.tokenizer.encode("hello")) == "hello"
    assert files.context_length == 1000


def test_from_card_without_files_is_a_clear_error():
    with pytest.raises(TokenizerError, match="carries no tokenizer files"):
        ModelFiles.from_card(ModelCard(name="m", source_path="/nowhere"))
