"""Model implementations; importing this package registers every architecture."""

from stator.engines.native.models import gpt_oss, llama, qwen2, qwen3  # noqa: F401  (registration)
from stator.engines.native.models.registry import MODELS, model_class, register

__all__ = ["MODELS", "model_class", "register"]
