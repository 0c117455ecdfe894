import argparse
import json

import pytest

from stator.config import add_flags, from_args
from stator.engines import registry
from stator.engines.mocker import MockerConfig, MockerEngine, create_engine
from stator.engines.mocker.model_info import read_model_info


def test_registry_finds_the_mocker(tiny_model_dir):
    assert registry.engine_config_class("mocker") is MockerConfig
    engine = registry.create_engine("mocker", MockerConfig(), str(tiny_model_dir), "tiny")
    assert isinstance(engine, MockerEngine)


def test_card_comes_from_the_model_dir_and_flags(tiny_model_dir):
    config = MockerConfig(block_size=32, num_gpu_blocks=100, max_num_seqs=7, role="decode")
    card = create_engine(config, str(tiny_model_dir), "served").model_card()
    assert card.name == "served" and card.engine == "mocker"
    assert card.source_path == str(tiny_model_dir)
    assert card.context_length == 2048  # max_position_embeddings of the tiny config
    assert (card.kv_block_size, card.total_kv_blocks, card.max_num_seqs) == (32, 100, 7)
    assert card.role == "decode"
    assert str(tiny_model_dir / "tokenizer.json") in card.tokenizer_files
    assert str(tiny_model_dir / "tokenizer_config.json") in card.tokenizer_files
    assert card.eos_token_ids == [5]  # <|im_end|>


def test_kv_bytes_per_token_from_config(tiny_model_dir):
    info = read_model_info(tiny_model_dir)
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    # layers × (K and V) × KV heads × head dim × 4 bytes (float32)
    assert (
        info.kv_bytes_per_token
        == cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * head_dim * 4
    )
    override = create_engine(MockerConfig(kv_bytes_per_token=10), str(tiny_model_dir), "t")
    assert override.kv_bytes_per_token == 10


def test_missing_config_json_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no config\\.json"):
        create_engine(MockerConfig(), str(tmp_path), "t")


@pytest.mark.parametrize(
    "bad",
    [
        {"num_gpu_blocks": 0},
        {"block_size": -1},
        {"speedup_ratio": -1.0},
        {"output_mode": "loud"},
        {"role": "both"},
    ],
)
def test_bad_settings_are_rejected(tiny_model_dir, bad):
    with pytest.raises(ValueError):
        create_engine(MockerConfig(**bad), str(tiny_model_dir), "t")


def test_flags_mirror_dynamo():
    parser = argparse.ArgumentParser()
    add_flags(parser, MockerConfig, env={})
    args = parser.parse_args(
        [
            "--num-gpu-blocks", "128", "--block-size", "16", "--max-num-seqs", "4",
            "--max-num-batched-tokens", "512", "--no-enable-prefix-caching",
            "--no-enable-chunked-prefill", "--speedup-ratio", "0", "--startup-time", "0.5",
            "--output-mode", "echo", "--role", "prefill", "--kv-transfer-bandwidth", "8",
        ]
    )  # fmt: skip
    config = from_args(MockerConfig, args)
    assert config.num_gpu_blocks == 128 and config.block_size == 16
    assert not config.enable_prefix_caching and not config.enable_chunked_prefill
    assert config.speedup_ratio == 0 and config.role == "prefill"


def test_env_twins(tiny_model_dir):
    parser = argparse.ArgumentParser()
    add_flags(parser, MockerConfig, env={"STATOR_SPEEDUP_RATIO": "100"})
    assert from_args(MockerConfig, parser.parse_args([])).speedup_ratio == 100
