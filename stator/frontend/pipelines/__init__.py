"""Which models this frontend serves (`ModelManager`, from discovery or the global
router) and, per model, its `ModelPipeline`: processor joined to router client."""

from stator.frontend.pipelines.manager import ModelEntry, ModelManager, RouteSource
from stator.frontend.pipelines.pipeline import ModelPipeline

__all__ = ["ModelEntry", "ModelManager", "ModelPipeline", "RouteSource"]
