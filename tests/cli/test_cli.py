import subprocess
import sys

import pytest

from stator import __version__
from stator.cli import worker as worker_cli
from stator.cli.main import main
from tests.procs import REPO, repo_env

FACTORY = "tests.worker.scripted_factory:create"


def stator(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "stator", *args],
        env=repo_env(**env),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"stator {__version__}"


def test_top_level_help_lists_worker_and_download():
    out = stator("--help").stdout
    assert "worker" in out and "download" in out


def test_worker_help_shows_defaults_env_twins_and_engine_flags():
    result = stator("worker", "--engine", FACTORY, "--help")
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())  # undo argparse's line wrapping
    for flag in ("--model", "--served-model-name", "--health-check-interval", "--discovery"):
        assert flag in out
    assert "(default: 30.0; env STATOR_HEALTH_CHECK_INTERVAL)" in out
    assert "env STATOR_NAMESPACE" in out and "env STATOR_SYSTEM_PORT" in out
    # The custom engine's config class contributes its flags.
    assert "--token-delay" in out and "env STATOR_TOKEN_DELAY" in out
    assert "package.module:factory" in out


def test_worker_help_works_when_the_engine_cannot_load():
    result = stator("worker", "--engine", "no.such.module:factory", "--help")
    assert result.returncode == 0
    assert "--model" in result.stdout and "cannot load engine factory" in result.stderr


def test_download_help_shows_defaults_and_env_twins():
    result = stator("download", "--help")
    assert result.returncode == 0
    out = " ".join(result.stdout.split())
    assert "env STATOR_REVISION" in out and "env STATOR_CACHE_DIR" in out


def test_env_twin_reaches_the_engine_config(monkeypatch):
    monkeypatch.setenv("STATOR_TOKEN_DELAY", "0.25")
    spec = worker_cli.load_engine_spec(FACTORY)
    args = worker_cli.full_parser(spec).parse_args([])
    assert args.token_delay == 0.25
    assert worker_cli.full_parser(spec).parse_args(["--token-delay", "1"]).token_delay == 1.0


def test_env_twin_takes_effect_in_the_worker_process(tmp_path):
    # An unknown custom engine named through the env var: the error names it.
    result = stator("worker", STATOR_ENGINE="tests.worker.nope:create")
    assert result.returncode == 2
    assert "tests.worker.nope:create" in result.stderr


def test_unknown_engine_and_unknown_flag_are_clear_errors(tiny_model_dir):
    result = stator("worker", "--engine", "warp-drive")
    assert result.returncode == 2 and "unknown engine 'warp-drive'" in result.stderr
    result = stator("worker", "--engine", FACTORY, "--model", str(tiny_model_dir), "--bogus", "1")
    assert result.returncode == 2 and "unrecognized arguments: --bogus" in result.stderr


def test_worker_with_a_bad_model_path_says_so(tmp_path):
    result = stator("worker", "--engine", FACTORY, "--model", str(tmp_path))
    assert result.returncode == 2
    assert "does not look like a model directory" in result.stderr


def test_download_prints_the_local_path(tiny_model_dir):
    result = stator("download", str(tiny_model_dir))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tiny_model_dir.resolve())


def test_download_offline_names_the_repo(tmp_path):
    result = stator(
        "download", "org/absent-model", "--cache-dir", str(tmp_path), HF_HUB_OFFLINE="1"
    )
    assert result.returncode == 1
    assert "'org/absent-model'" in result.stderr and "--model /path/to/" in result.stderr


def test_worker_flags_reach_every_config(monkeypatch, tiny_model_dir):
    seen = {}

    async def fake_serve_worker(runtime_config, worker_config, engine, model_dir):
        seen.update(runtime=runtime_config, worker=worker_config, engine=engine, dir=model_dir)
        return 0

    monkeypatch.setattr("stator.worker.main.serve_worker", fake_serve_worker)
    monkeypatch.setenv("STATOR_MIGRATION_LIMIT", "2")
    code = main(
        [
            "worker",
            "--engine",
            FACTORY,
            "--token-delay",
            "0.5",
            "--model",
            str(tiny_model_dir),
            "--namespace",
            "prod",
            "--discovery",
            "file:/tmp/x",
        ]
    )
    assert code == 0
    assert seen["engine"].delay == 0.5  # the engine's own flag
    assert seen["engine"].name == tiny_model_dir.name  # served name: the directory's
    assert seen["runtime"].namespace == "prod" and seen["runtime"].discovery == "file:/tmp/x"
    assert seen["worker"].migration_limit == 2  # from the env twin
    assert seen["worker"].endpoint_name("prod").namespace == "prod"
    assert seen["dir"] == tiny_model_dir.resolve()
