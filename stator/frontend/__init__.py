"""The HTTP edge: OpenAI-compatible routes, the model manager that watches discovery, and
one pipeline per model (preprocess -> router -> postprocess).

Names are imported lazily so that `stator --help` (which reads `FrontendConfig`) does not
pay for FastAPI and the tokenizer stack.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "FrontendConfig": "stator.frontend.config",
    "FrontendMetrics": "stator.frontend.metrics",
    "ModelManager": "stator.frontend.model_manager",
    "RunningFrontend": "stator.frontend.server",
    "create_app": "stator.frontend.app",
    "running_frontend": "stator.frontend.server",
    "serve_frontend": "stator.frontend.server",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'stator.frontend' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
