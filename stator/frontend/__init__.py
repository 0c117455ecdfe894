"""The HTTP edge. A request goes down these folders once:

    http/        the server: app and routes table, connection limits, keys and rate
                 limits, request ids, API processes, drain, worker-admin routes
    openai/      OpenAI request bodies and response objects; the chat, completions and
                 responses routes; server-sent events
    pipelines/   which models are served (`ModelManager`) and each one's `ModelPipeline`:
                 its processor joined to its router client
    processor/   the `Processor` seam: request -> `EngineRequest`s, `EngineOutput`s ->
                 deltas (template, tokenize, detokenize, stop strings, reasoning and
                 tool-call parsing); `stator/` (ours) and `vllm/` (vLLM's classes)
    routing/     the router client: routers over the workers, choice streams, hints

`config.py`, `errors.py` (OpenAI error objects) and `metrics.py` serve every layer.

Names are imported lazily so that `stator --help` (which reads `FrontendConfig`) does not
pay for FastAPI and the tokenizer stack.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "FrontendConfig": "stator.frontend.config",
    "FrontendMetrics": "stator.frontend.metrics",
    "ModelManager": "stator.frontend.pipelines.manager",
    "RunningFrontend": "stator.frontend.server",
    "create_app": "stator.frontend.http.app",
    "running_frontend": "stator.frontend.server",
    "serve_frontend": "stator.frontend.server",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'stator.frontend' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
