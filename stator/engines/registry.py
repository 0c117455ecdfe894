"""Which engines exist, their config classes and factories, imported only when chosen.

Each engine package exposes a config dataclass (flags for `stator worker --engine NAME`)
and a factory `create_engine(config, model_path, served_name) -> Engine`. `model_path` is
a resolved local directory (see `stator.worker.model_resolution`).
"""

from __future__ import annotations

import importlib
from typing import Any

from stator.engines.base import Engine

# name -> (module, config class, factory function)
ENGINES: dict[str, tuple[str, str, str]] = {
    "mocker": ("stator.engines.mocker", "MockerConfig", "create_engine"),
    "native": ("stator.engines.native", "NativeConfig", "create_engine"),
    "vllm": ("stator.engines.vllm", "VllmConfig", "create_engine"),
}


def engine_names() -> list[str]:
    return list(ENGINES)


def _module(name: str) -> Any:
    if name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; choose one of: {', '.join(ENGINES)}")
    module_name = ENGINES[name][0]
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"engine {name!r} is not available here: {exc}") from exc


def engine_config_class(name: str) -> type:
    return getattr(_module(name), ENGINES[name][1])


def create_engine(name: str, config: Any, model_path: str, served_name: str) -> Engine:
    factory = getattr(_module(name), ENGINES[name][2])
    return factory(config, model_path, served_name)
