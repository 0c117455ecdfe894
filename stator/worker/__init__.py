"""The generic worker host: puts any `Engine` on the fleet (see `host.py`).

Public surface, imported on first use so that `stator --help` stays fast:
`WorkerHost`, `WorkerConfig`, `serve_worker`, `resolve_model`, `ModelNotFound`.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "WorkerHost": "stator.worker.host",
    "WorkerConfig": "stator.worker.config",
    "serve_worker": "stator.worker.main",
    "resolve_model": "stator.worker.model_resolution",
    "ModelNotFound": "stator.worker.model_resolution",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'stator.worker' has no attribute {name!r}")


__all__ = list(_EXPORTS)
