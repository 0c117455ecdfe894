"""`resolve_adapter`: where a LoRA adapter's files are, from what a user named.

A local directory (or `file://` URI) is served only from inside `allowed_dirs` when the
load comes at run time (over HTTP or the admin endpoint, from whoever can reach them);
adapters named on the command line are the operator's own choice and skip that check. Any
other name of the form `owner/name` is a Hugging Face repo id, downloaded into the hub cache.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlparse

from stator.engines.base import EngineError

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_ADAPTER_FILES = ["adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"]


def within(path: Path, dirs: list[str]) -> bool:
    """Is `path` (resolved: no `..` or symlink escapes) inside one of `dirs`?"""
    resolved = path.resolve()
    for d in dirs:
        root = Path(d).expanduser().resolve()
        if resolved == root or root in resolved.parents:
            return True
    return False


def resolve_adapter(source: str, *, allowed_dirs: list[str] | None) -> Path:
    """The local directory of adapter `source`. `allowed_dirs=None`: any local path."""
    if source.startswith("file://"):
        source = unquote(urlparse(source).path)
    elif "://" in source:
        raise EngineError(f"LoRA source {source!r}: use a local path or a Hugging Face repo id")
    path = Path(source).expanduser()
    local = path.is_absolute() or source.startswith(".") or path.exists()
    if local or not _REPO_ID.match(source):
        if allowed_dirs is not None and not within(path, allowed_dirs):
            where = ", ".join(allowed_dirs) if allowed_dirs else "none are allowed"
            raise EngineError(
                f"LoRA path {source!r} is outside --lora-allowed-dirs ({where}); "
                "run-time loads read only from those directories"
            )
        if not (path / "adapter_config.json").is_file():
            raise EngineError(f"LoRA source {source!r} is not a PEFT adapter directory")
        return path.resolve()
    return _download(source)


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        local = snapshot_download(repo_id, allow_patterns=_ADAPTER_FILES)
    except Exception as exc:  # network, auth, missing repo: the user's problem to see
        raise EngineError(f"cannot download LoRA adapter {repo_id!r}: {exc}") from exc
    path = Path(local)
    if not (path / "adapter_config.json").is_file():
        raise EngineError(f"Hugging Face repo {repo_id!r} is not a PEFT adapter")
    return path
