"""`stator worker --engine vllm`: vLLM's engine arguments pass through. (A worker whose
vLLM engine is killed exits non-zero: checked at the end of test_e2e.py, on its workers.)"""

from __future__ import annotations

import argparse

import pytest

from tests.engines.vllm.conftest import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)


from stator.cli.main import main
from stator.cli.worker import build_engine_config, full_parser, load_engine_spec
from stator.engines.vllm import VllmConfig
from stator.engines.vllm.args import engine_args

pytestmark = pytest.mark.integration


def parse(argv: list[str]) -> VllmConfig:
    spec = load_engine_spec("vllm")
    namespace = full_parser(spec).parse_args(argv, namespace=argparse.Namespace())
    return build_engine_config(spec, namespace)


def test_vllm_engine_arguments_pass_through(llama_dir):
    model = str(llama_dir)
    config = parse(
        [
            "--model",
            "/m",
            "--max-model-len",
            "512",
            "--enforce-eager",
            "--no-kv-events",
            "--engine-monitor-interval",
            "3",
            "--enable-lora",
            "--max-lora-rank",
            "32",
        ]
    )
    assert config.kv_events is False
    assert config.engine_monitor_interval == 3.0
    assert config.engine_args == {
        "max_model_len": 512,
        "enforce_eager": True,
        "enable_lora": True,
        "max_lora_rank": 32,
    }
    args = engine_args(config, model, "served")
    assert args.model == model and args.served_model_name == ["served"]
    assert args.max_model_len == 512 and args.enable_prefix_caching
    assert args.kv_events_config is None
    assert args.max_loras == config.default_max_loras  # one slot kept free for the base


def test_kv_events_go_to_a_loopback_port(llama_dir):
    import msgspec
    from vllm.distributed.kv_events import KVEventBatch

    from stator.engines.vllm.kv_events import KvEventRelay

    relay = KvEventRelay.on_loopback("kv", msgspec.msgpack.Decoder(KVEventBatch))
    try:
        assert relay.endpoint.startswith("tcp://127.0.0.1:")
        model = str(llama_dir)
        args = engine_args(parse(["--model", model]), model, "served", relay.endpoint)
        assert args.kv_events_config.endpoint == relay.endpoint
        assert args.kv_events_config.enable_kv_cache_events
    finally:
        relay.close()


def test_stator_owns_model_and_served_name_flags():
    config = parse(["--model", "/m", "--served-model-name", "x", "--reasoning-parser", "qwen3"])
    assert config.engine_args == {}


def stator_help(capsys, *argv: str) -> str:
    """`stator ARGV --help`'s output, run in this process: vLLM is imported already, where a
    `stator` process would spend seconds importing it again."""
    try:
        code = main([*argv, "--help"])
    except SystemExit as exc:  # argparse's own --help
        code = exc.code
    assert code == 0
    return capsys.readouterr().out


def test_help_lists_stator_and_vllm_flags(capsys):
    out = stator_help(capsys, "worker", "--engine", "vllm")
    for flag in ("--health-check-interval", "--engine-monitor-interval", "--kv-events"):
        assert flag in out
    for flag in ("--enforce-eager", "--max-model-len", "--enable-lora", "--kv-events-config"):
        assert flag in out
    assert "vLLM engine arguments" in out


def test_stator_run_help_lists_vllm_flags(capsys):
    out = stator_help(capsys, "run", "--engine", "vllm")
    assert "--enforce-eager" in out and "--workers" in out and "vLLM engine arguments" in out
