"""`ModelPipeline`: one served model's path, its `Processor` joined to its `RouterClient`.

    OpenAI request ─▶ processor.chat / .completion ─▶ PreparedRequest (EngineRequest per
    choice) ─▶ open() ─▶ RouterClient.generate ─▶ ChoiceStream (the choice's
    OutputProcessor) ─▶ Deltas ─▶ the route's parser and chunks

The OpenAI routes (`frontend.openai`) hold the HTTP shapes; the pipeline holds what a
model needs to serve them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from stator.frontend.metrics import FrontendMetrics
from stator.frontend.processor import PreparedRequest, Processor, create_processor
from stator.frontend.routing import ChoiceStream, RouterClient
from stator.protocols import ModelCard
from stator.router import RouterConfig
from stator.runtime import Runtime
from stator.runtime.names import EndpointName


class ModelPipeline:
    def __init__(
        self,
        card: ModelCard,
        processor: Processor,
        routes: RouterClient,
        metrics: FrontendMetrics,
    ) -> None:
        self.card = card
        self.name = card.name
        self.processor = processor
        self.routes = routes
        self.metrics = metrics
        self.model_metrics = metrics.for_model(self.name)

    @classmethod
    async def create(
        cls,
        runtime: Runtime,
        card: ModelCard,
        endpoint: EndpointName,
        router_config: RouterConfig,
        metrics: FrontendMetrics,
        allowed_workers: Callable[[], Collection[int]] | None = None,
        router: Any = None,
        processor: str = "stator",
    ) -> ModelPipeline:
        """`allowed_workers` and `router`: as `RouterClient.create` takes them;
        `processor`: which `Processor` ("stator" or "vllm")."""
        built = await create_processor(processor, card, metrics)
        routes = await RouterClient.create(
            runtime, card, endpoint, router_config, metrics, allowed_workers, router
        )
        return cls(card, built, routes, metrics)

    @property
    def router(self) -> Any:
        """The decode (or aggregated) workers' router (busy thresholds, tests)."""
        return self.routes.router

    @property
    def client(self) -> Any:
        return self.routes.client

    def open(self, prepared: PreparedRequest) -> list[ChoiceStream]:
        """Send every choice of a prepared request to the workers (lazily: nothing is
        routed before a stream is primed or read)."""
        return [
            ChoiceStream(
                plan.index,
                plan.request,
                plan.output,
                self.routes.generate(plan.request),
                self.metrics,
                plan.keep_token_deltas,
            )
            for plan in prepared.choices
        ]

    async def close(self) -> None:
        await self.routes.close()
