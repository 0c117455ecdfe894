import time
from pathlib import Path

import pytest

from stator.worker import model_resolution
from stator.worker.model_resolution import ModelNotFound, looks_like_repo_id, resolve_model


def test_a_local_model_directory_is_used_as_is(tiny_model_dir):
    assert resolve_model(str(tiny_model_dir)) == tiny_model_dir.resolve()


def test_a_directory_without_model_files_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ModelNotFound, match="does not look like a model directory"):
        resolve_model(str(tmp_path))


def test_a_file_is_not_a_model_directory(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"x")
    with pytest.raises(ModelNotFound, match="is not a directory"):
        resolve_model(str(path))


def test_a_missing_relative_path_is_not_taken_for_a_repo_id():
    with pytest.raises(ModelNotFound, match="neither an existing directory"):
        resolve_model("./no/such/model/dir")
    assert looks_like_repo_id("Qwen/Qwen3-0.6B") and looks_like_repo_id("gpt2")
    assert not looks_like_repo_id("/abs/path") and not looks_like_repo_id("a/b/c")


def test_empty_model_is_a_clear_error():
    with pytest.raises(ModelNotFound, match="no model given"):
        resolve_model("")


def test_a_repo_id_goes_to_snapshot_download_with_every_option(monkeypatch, tiny_model_dir):
    calls = []

    def fake_snapshot_download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return str(tiny_model_dir)

    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_snapshot_download)
    monkeypatch.setenv("HF_TOKEN", "hf_from_env")
    path = resolve_model(
        "org/model",
        revision="v1",
        allow_patterns=["*.json"],
        ignore_patterns=["*.bin"],
        cache_dir="/tmp/hf-cache",
    )
    assert path == tiny_model_dir.resolve()
    assert calls == [
        (
            "org/model",
            {
                "revision": "v1",
                "token": "hf_from_env",
                "allow_patterns": ["*.json"],
                "ignore_patterns": ["*.bin"],
                "cache_dir": "/tmp/hf-cache",
            },
        )
    ]
    resolve_model("org/model", token="explicit")
    assert calls[-1][1]["token"] == "explicit"


def test_offline_hub_gives_a_clear_error_quickly(monkeypatch, tmp_path):
    # The real huggingface_hub call, in offline mode, with an empty cache.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    began = time.monotonic()
    with pytest.raises(ModelNotFound) as info:
        resolve_model("stator-test/does-not-exist", cache_dir=str(tmp_path))
    message = str(info.value)
    assert "'stator-test/does-not-exist'" in message
    assert "--model /path/to/does-not-exist" in message
    assert time.monotonic() - began < 30


def test_errors_from_the_hub_are_translated(monkeypatch):
    from huggingface_hub.errors import RepositoryNotFoundError

    def not_found(repo_id, **kwargs):
        # Built without an HTTP response, which its constructor insists on.
        err = RepositoryNotFoundError.__new__(RepositoryNotFoundError)
        Exception.__init__(err, "404 Repository Not Found")
        raise err

    monkeypatch.setattr("huggingface_hub.snapshot_download", not_found)
    with pytest.raises(ModelNotFound, match="not found"):
        resolve_model("org/missing")


def test_a_download_without_model_files_is_refused(monkeypatch, tmp_path):
    monkeypatch.setattr("huggingface_hub.snapshot_download", lambda repo_id, **kw: str(tmp_path))
    with pytest.raises(ModelNotFound, match="does not look like a model directory"):
        resolve_model("org/weird")


def test_marker_files_cover_tokenizer_only_directories(tmp_path: Path):
    (tmp_path / "tokenizer.json").write_text("{}")
    assert model_resolution.check_model_dir(tmp_path) == tmp_path.resolve()
