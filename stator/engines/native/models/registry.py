"""Architecture name (config.json `architectures[0]`) -> model class. A model file
registers itself with `@register("FooForCausalLM")`; nothing else needs to change."""

from __future__ import annotations

from collections.abc import Callable

MODELS: dict[str, type] = {}


def register(*architectures: str) -> Callable[[type], type]:
    def add(cls: type) -> type:
        for name in architectures:
            MODELS[name] = cls
        return cls

    return add


def model_class(architecture: str) -> type:
    try:
        return MODELS[architecture]
    except KeyError:
        supported = ", ".join(sorted(MODELS))
        raise ValueError(
            f"architecture {architecture!r} is not supported by the native engine; "
            f"supported: {supported}"
        ) from None
