"""`resolve_adapter`: local paths inside the allowed directories only, repo ids downloaded."""

from __future__ import annotations

import json

import pytest

from stator.engines.base import EngineError
from stator.engines.native.lora import resolve as resolve_mod
from stator.engines.native.lora.resolve import resolve_adapter


def adapter_dir(path):
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    return path


def test_local_paths_inside_the_allowed_dirs(tmp_path):
    allowed = tmp_path / "allowed"
    inside = adapter_dir(allowed / "a")
    assert resolve_adapter(str(inside), allowed_dirs=[str(allowed)]) == inside.resolve()
    assert resolve_adapter(f"file://{inside}", allowed_dirs=[str(allowed)]) == inside.resolve()
    assert resolve_adapter(str(inside), allowed_dirs=None) == inside.resolve()
    outside = adapter_dir(tmp_path / "outside")
    for source in (str(outside), str(allowed / ".." / "outside")):
        with pytest.raises(EngineError, match="outside --lora-allowed-dirs"):
            resolve_adapter(source, allowed_dirs=[str(allowed)])
    link = allowed / "link"
    link.symlink_to(outside)  # a symlink out of the allowed tree does not escape
    with pytest.raises(EngineError, match="outside --lora-allowed-dirs"):
        resolve_adapter(str(link), allowed_dirs=[str(allowed)])
    with pytest.raises(EngineError, match="not a PEFT adapter"):
        resolve_adapter(str(allowed), allowed_dirs=[str(allowed)])
    with pytest.raises(EngineError, match="local path or a Hugging Face repo id"):
        resolve_adapter("https://example.com/a", allowed_dirs=None)


def test_repo_ids_are_downloaded(tmp_path, monkeypatch):
    calls = []

    def fake_download(repo_id, allow_patterns):
        calls.append((repo_id, allow_patterns))
        if repo_id == "owner/missing":
            raise OSError("404")
        return str(adapter_dir(tmp_path / repo_id.replace("/", "--")))

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    got = resolve_adapter("owner/sql-lora", allowed_dirs=[])
    assert got == tmp_path / "owner--sql-lora" and calls[0][0] == "owner/sql-lora"
    assert "adapter_config.json" in calls[0][1]
    with pytest.raises(EngineError, match="cannot download"):
        resolve_adapter("owner/missing", allowed_dirs=[])
    assert resolve_mod._REPO_ID.match("owner/name.v1")
