"""`RouterClient`: a model's way to its workers.

The router over the model's endpoint (decode or aggregated workers) and the one over its
namespace's prefill workers, joined by `DisaggRouter`; or, under the global router, the
router-shaped object it gives for the model. `generate` is all the request path uses.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Collection
from typing import Any

import msgspec

from stator.frontend.metrics import FrontendMetrics
from stator.protocols import AdminResponse, EngineOutput, EngineRequest, ModelCard
from stator.router import Router, RouterConfig
from stator.router.disagg import DisaggRouter
from stator.runtime import Client, Runtime
from stator.runtime.names import PREFILL_COMPONENT, EndpointName


class RouterClient:
    def __init__(self, client: Client, router: Any, disagg: Any = None) -> None:
        self.client = client
        # The decode (or aggregated) workers' router; `disagg` adds the prefill workers'.
        self.router = router
        self.disagg = disagg or DisaggRouter(router, None, router.config)

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
    ) -> RouterClient:
        """`allowed_workers`: the only workers to route to (those that publish this card,
        for a LoRA adapter that not every worker of the endpoint has loaded). `router`: a
        router-shaped object to use instead of the routers over `endpoint` and its prefill
        workers (the global router's view of the model: `generate`, busy thresholds,
        `client`, `close`)."""
        if router is not None:
            return cls(router.client, router, disagg=router)
        client = await runtime.client(endpoint, EngineOutput)
        decode = Router(
            runtime,
            client,
            card,
            router_config,
            registry=metrics.registry,
            allowed_workers=allowed_workers,
        )
        # Prefill workers of this namespace, wherever the model's own workers serve.
        prefill_endpoint = EndpointName(endpoint.namespace, PREFILL_COMPONENT, endpoint.endpoint)
        prefill_client = await runtime.client(prefill_endpoint, EngineOutput)
        prefill = Router(
            runtime,
            prefill_client,
            msgspec.structs.replace(card, role="prefill"),
            dataclasses.replace(router_config, router_replica_sync=False),
            registry=metrics.registry,
        )
        admin = await runtime.client(prefill_endpoint.sibling("admin"), AdminResponse)
        disagg = DisaggRouter(decode, prefill, router_config, prefill_admin=admin)
        await disagg.start()
        return cls(client, decode, disagg)

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """The request's outputs from the model's workers (prefill and decode ones when
        the model has both)."""
        return self.disagg.generate(request)

    async def close(self) -> None:
        await self.disagg.close()
        await self.client.close()
        for client in (self.disagg.prefill, self.disagg.prefill_admin):
            if client is not None:
                await (client.client if isinstance(client, Router) else client).close()
