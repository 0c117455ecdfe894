from pathlib import Path

import pytest

from stator.protocols import ModelCard
from stator.runtime.names import EndpointName
from stator.worker.card import build_card, inline_files, model_files
from stator.worker.config import WorkerConfig


def test_endpoint_follows_the_namespace_unless_given_in_full():
    assert WorkerConfig().endpoint_name("prod") == EndpointName("prod", "backend", "generate")
    assert WorkerConfig(endpoint="prefill.generate").endpoint_name("prod") == EndpointName(
        "prod", "prefill", "generate"
    )
    assert WorkerConfig(endpoint="a.b.c").endpoint_name("prod") == EndpointName("a", "b", "c")
    with pytest.raises(ValueError, match=r"namespace\.component\.endpoint"):
        WorkerConfig(endpoint="a.b.c.d").endpoint_name("prod")


def test_served_name_defaults_to_directory_name_or_repo_id(tmp_path):
    model_dir = tmp_path / "my-llama"
    model_dir.mkdir()
    assert WorkerConfig(model=str(model_dir)).served_name(model_dir) == "my-llama"
    assert WorkerConfig(model="org/name").served_name(Path("/cache/snap/abc")) == "org/name"
    assert WorkerConfig(model="x", served_model_name="mine").served_name(model_dir) == "mine"


def test_card_keeps_engine_fields_and_adds_files(tiny_model_dir):
    engine_card = ModelCard(name="e", source_path="", kv_block_size=32, context_length=2048)
    card = build_card(engine_card, WorkerConfig(), "served", tiny_model_dir)
    assert (card.name, card.kv_block_size, card.context_length) == ("served", 32, 2048)
    assert card.source_path == str(tiny_model_dir)
    assert set(card.files) == {p.name for p in model_files(tiny_model_dir)}
    assert "generation_config.json" in card.files


def test_card_does_not_override_engine_files_and_rejects_bad_context(tiny_model_dir):
    engine_card = ModelCard(name="e", source_path="/elsewhere", tokenizer_files=["/elsewhere/t"])
    card = build_card(engine_card, WorkerConfig(), "e", tiny_model_dir)
    assert card.source_path == "/elsewhere" and card.tokenizer_files == ["/elsewhere/t"]
    with pytest.raises(ValueError, match="must be positive"):
        build_card(engine_card, WorkerConfig(max_model_len=-1), "e", None)


def test_max_model_len_lowers_the_card_and_is_refused_past_the_engine():
    engine_card = ModelCard(name="e", source_path="", context_length=2048, engine="mocker")
    assert (
        build_card(engine_card, WorkerConfig(max_model_len=1024), "e", None).context_length == 1024
    )
    assert build_card(engine_card, WorkerConfig(), "e", None).context_length == 2048
    with pytest.raises(ValueError, match="more than the mocker engine holds"):
        build_card(engine_card, WorkerConfig(max_model_len=8192), "e", None)


def test_files_too_big_to_inline_are_left_out_entirely(tiny_model_dir):
    files = model_files(tiny_model_dir)
    assert inline_files(files, limit=10) == {}
    assert len(inline_files(files, limit=10**9)) == len(files)


def test_gpt_oss_cards_choose_the_harmony_parsers_unless_told_otherwise(tmp_path):
    import json

    model_dir = tmp_path / "gpt-oss"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps({"model_type": "gpt_oss"}))
    engine_card = ModelCard(name="e", source_path="")
    card = build_card(engine_card, WorkerConfig(), "e", model_dir)
    assert (card.reasoning_parser, card.tool_call_parser) == ("gpt_oss", "harmony")
    told = WorkerConfig(reasoning_parser="deepseek_r1", tool_call_parser="hermes")
    card = build_card(engine_card, told, "e", model_dir)
    assert (card.reasoning_parser, card.tool_call_parser) == ("deepseek_r1", "hermes")


def test_other_models_get_no_parsers_by_default(tiny_model_dir):
    card = build_card(ModelCard(name="e", source_path=""), WorkerConfig(), "e", tiny_model_dir)
    assert card.reasoning_parser is None and card.tool_call_parser is None
