"""Flag names shared across subcommands: one canonical name, older names as aliases."""

from __future__ import annotations

import argparse

from stator.cli import frontend as frontend_cli
from stator.cli import run as run_cli
from stator.cli.worker import build_engine_config, load_engine_spec
from stator.config import add_flags, from_args, option
from stator.frontend.config import FrontendConfig
from stator.runtime import RuntimeConfig
from stator.worker.config import WorkerConfig


def _run_args(*argv: str):
    spec = load_engine_spec("mocker")
    parsed = run_cli.full_parser(spec).parse_args(["--engine", "mocker", *argv])
    return spec, parsed


def _frontend_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    frontend_cli.register(parser.add_subparsers())
    return parser.parse_args(["frontend", *argv])


def test_run_takes_http_host_and_port_and_the_old_names():
    _, parsed = _run_args()
    config = from_args(FrontendConfig, parsed)
    assert (config.http_host, config.http_port) == ("127.0.0.1", 8000)
    for host, port in (("--http-host", "--http-port"), ("--host", "--port")):
        _, parsed = _run_args(host, "0.0.0.0", port, "9001")
        config = from_args(FrontendConfig, parsed)
        assert (config.http_host, config.http_port) == ("0.0.0.0", 9001)


def test_frontend_binds_loopback_by_default_and_host_stays_the_planes_address():
    args = _frontend_args()
    assert from_args(FrontendConfig, args).http_host == "127.0.0.1"
    args = _frontend_args("--host", "10.0.0.5", "--port", "9002")
    assert from_args(RuntimeConfig, args).host == "10.0.0.5"
    http = from_args(FrontendConfig, args)
    assert (http.http_host, http.http_port) == ("127.0.0.1", 9002)


def test_max_model_len_sets_worker_and_engine_alike_under_either_name():
    for flag in ("--max-model-len", "--context-length"):
        spec, parsed = _run_args(flag, "1234")
        assert from_args(WorkerConfig, parsed).max_model_len == 1234
        assert build_engine_config(spec, parsed).max_model_len == 1234


def test_the_env_twin_is_the_canonical_name():
    parser = argparse.ArgumentParser()
    add_flags(parser, WorkerConfig, env={"STATOR_MAX_MODEL_LEN": "77"})
    assert from_args(WorkerConfig, parser.parse_args([])).max_model_len == 77
    assert from_args(WorkerConfig, parser.parse_args(["--context-length", "5"])).max_model_len == 5


def test_an_alias_another_flag_holds_is_left_out():
    import dataclasses

    @dataclasses.dataclass
    class A:
        host: str = option("a", "first")

    @dataclasses.dataclass
    class B:
        http_host: str = option("b", "second", aliases=("--host",))

    parser = argparse.ArgumentParser()
    add_flags(parser, A)
    add_flags(parser, B)
    args = parser.parse_args(["--host", "x", "--http-host", "y"])
    assert (args.host, args.http_host) == ("x", "y")


def test_list_flags_accumulate_and_secrets_stay_out_of_help():
    parser = argparse.ArgumentParser()
    add_flags(parser, FrontendConfig, env={"STATOR_API_KEY": "from-env"})
    assert "from-env" not in parser.format_help()
    assert parser.parse_args([]).api_key == ["from-env"]
    args = parser.parse_args(["--api-key", "a,b", "--api-key", "c"])
    assert args.api_key == ["a", "b", "c"]
