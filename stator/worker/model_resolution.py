"""Where a model's files are: a local directory as given, or a Hugging Face repo id
fetched into the local cache with `huggingface_hub`.

    path = resolve_model("Qwen/Qwen3-0.6B", revision="main")
    path = resolve_model("/models/my-llama")
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from stator.config import option

# A directory counts as a model when it has one of these (weights alone are not enough:
# the frontend needs the tokenizer, the engine the config).
MARKER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model")


class ModelNotFound(Exception):
    """The model could not be found or fetched; the message says how to fix it."""


@dataclass
class DownloadConfig:
    revision: str | None = option(None, "Hugging Face revision: branch, tag or commit")
    allow_patterns: list[str] | None = option(
        None, "Only fetch files matching these glob patterns (comma-separated)"
    )
    ignore_patterns: list[str] | None = option(
        None, "Skip files matching these glob patterns (comma-separated)"
    )
    cache_dir: str | None = option(
        None, "Hugging Face cache directory; unset: huggingface_hub's (HF_HOME)"
    )


def looks_like_repo_id(model: str) -> bool:
    """`org/name` or `name`: no path separators beyond one slash, not a relative path."""
    if model.startswith((".", "/", "~")) or os.sep + os.sep in model:
        return False
    parts = model.split("/")
    return 1 <= len(parts) <= 2 and all(parts)


def check_model_dir(path: Path) -> Path:
    if not path.is_dir():
        raise ModelNotFound(f"model path {str(path)!r} is not a directory")
    if not any((path / name).is_file() for name in MARKER_FILES):
        wanted = ", ".join(MARKER_FILES)
        raise ModelNotFound(
            f"{str(path)!r} does not look like a model directory: it has none of {wanted}"
        )
    return path.resolve()


def resolve_model(
    model: str,
    revision: str | None = None,
    token: str | None = None,
    allow_patterns: list[str] | None = None,
    ignore_patterns: list[str] | None = None,
    cache_dir: str | Path | None = None,
) -> Path:
    """The local directory holding `model`'s files. `token` defaults to `HF_TOKEN`."""
    if not model:
        raise ModelNotFound("no model given: pass a local directory or a Hugging Face repo id")
    local = Path(model).expanduser()
    if local.exists():
        return check_model_dir(local)
    if not looks_like_repo_id(model):
        raise ModelNotFound(
            f"model {model!r} is neither an existing directory nor a Hugging Face repo id"
        )
    return _download(
        model,
        revision=revision,
        token=token if token is not None else os.environ.get("HF_TOKEN") or None,
        allow_patterns=allow_patterns,
        ignore_patterns=ignore_patterns,
        cache_dir=cache_dir,
    )


def _download(repo_id: str, **kwargs) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    hint = f"pass a local directory instead: --model /path/to/{repo_id.split('/')[-1]}"
    try:
        path = snapshot_download(repo_id, **kwargs)
    except GatedRepoError as exc:
        raise ModelNotFound(
            f"{repo_id!r} is gated: accept its license on huggingface.co and set HF_TOKEN ({exc})"
        ) from exc
    except RevisionNotFoundError as exc:
        raise ModelNotFound(f"{repo_id!r} has no revision {kwargs.get('revision')!r}") from exc
    except RepositoryNotFoundError as exc:
        raise ModelNotFound(
            f"Hugging Face repo {repo_id!r} not found (or private: set HF_TOKEN); {hint}"
        ) from exc
    except HFValidationError as exc:
        raise ModelNotFound(f"{repo_id!r} is not a valid Hugging Face repo id: {exc}") from exc
    except HfHubHTTPError as exc:
        raise ModelNotFound(f"the Hugging Face Hub refused {repo_id!r}: {exc}; {hint}") from exc
    except (LocalEntryNotFoundError, OSError) as exc:
        # Offline (HF_HUB_OFFLINE=1 or no network) and not in the cache.
        raise ModelNotFound(
            f"cannot fetch {repo_id!r} from the Hugging Face Hub (no network or offline "
            f"mode, and it is not in the local cache); {hint}"
        ) from exc
    return check_model_dir(Path(path))
