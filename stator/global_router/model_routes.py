"""`ModelRoutes`: one model's face of the global router, shaped like the routers a frontend
pipeline holds, so that `stator frontend --global-router-config` serves the pools' models
with its ordinary pipeline."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from stator.protocols import EngineOutput, EngineRequest
from stator.router import Router

if TYPE_CHECKING:
    from stator.global_router.router import GlobalRouter


class _Instances:
    """The `client` a frontend pipeline asks for its model's live workers."""

    def __init__(self, routes: ModelRoutes) -> None:
        self.routes = routes

    def instance_ids(self) -> list[int]:
        return self.routes.global_router.live_workers(self.routes.model)

    async def close(self) -> None:
        pass


class ModelRoutes:
    """One model's face of the global router, shaped like a `Router` for the frontend:
    `generate`, the busy thresholds (applied to the model's router in every pool),
    `client.instance_ids()` and `close()`."""

    def __init__(self, global_router: GlobalRouter, model: str) -> None:
        self.global_router = global_router
        self.model = model
        self.client = _Instances(self)
        # The pools' routers are the global router's to close, not the pipeline's.
        self.prefill = None
        self.prefill_admin = None

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        return self.global_router.generate(request)

    def _routers(self) -> list[Router]:
        out = []
        for pool in self.global_router.pools.values():
            route = pool.routes.get((self.model, "serve"))
            router = route.ready() if route is not None else None
            if router is not None:
                out.append(router)
        return out

    def busy_thresholds(self) -> dict[str, float | int | None]:
        routers = self._routers()
        if routers:
            return routers[0].busy_thresholds()
        thresholds = self.global_router.router_config.busy_thresholds()
        return {
            "active_decode_blocks_threshold": thresholds.active_decode_blocks_threshold,
            "active_prefill_tokens_threshold": thresholds.active_prefill_tokens_threshold,
        }

    def set_busy_thresholds(self, **changes) -> dict[str, float | int | None]:
        result = self.busy_thresholds()
        for router in self._routers():
            result = router.set_busy_thresholds(**changes)
        return result

    async def close(self) -> None:
        pass
