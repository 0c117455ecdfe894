"""`Pool`: one namespace of workers as the global router sees it.

A pool has its own `Runtime` (the event plane's topics and the ZMQ publisher directory are
per namespace), watches the model cards published in its namespace, and keeps one local
`Router` per (model, role): aggregated and decode workers are served through the
"serve" router, prefill workers through the "prefill" one. The local router then picks
the worker inside the pool exactly as a frontend's router would.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
from prometheus_client import CollectorRegistry

from stator.protocols import AdminResponse, EngineOutput, ModelCard, decode
from stator.router import Router, RouterConfig
from stator.router.busy import is_busy
from stator.runtime import Client, Runtime, RuntimeConfig
from stator.runtime.names import PREFILL_COMPONENT, EndpointName, models_prefix
from stator.runtime.tasks import cancel_and_wait, close_built

log = logging.getLogger(__name__)


def _endpoint_of(key: str) -> EndpointName:
    parts = key.split("/")  # v1/models/ns/comp/ep/id[/suffix]
    if len(parts) < 6:
        raise ValueError(f"not a model-card key: {key}")
    return EndpointName(parts[2], parts[3], parts[4])


def role_group(card: ModelCard) -> str:
    """ "prefill" for prefill workers; "serve" for those that produce the output."""
    return "prefill" if card.role == "prefill" else "serve"


@dataclass
class PoolRoute:
    """The workers of one model and role group in one pool, and the router over them."""

    card: ModelCard
    endpoint: EndpointName
    keys: set[str] = field(default_factory=set)
    router: asyncio.Task[Router] | None = None

    def ready(self) -> Router | None:
        task = self.router
        if task is None or not task.done() or task.cancelled() or task.exception():
            return None
        return task.result()


class Pool:
    def __init__(
        self,
        namespace: str,
        runtime_config: RuntimeConfig,
        router_config: RouterConfig,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.namespace = namespace
        self.runtime_config = dataclasses.replace(runtime_config, namespace=namespace)
        self.router_config = router_config
        self.registry = registry
        self.runtime: Runtime | None = None
        # (model, role group) -> route
        self.routes: dict[tuple[str, str], PoolRoute] = {}
        self._key_route: dict[str, tuple[str, str]] = {}
        self._watch: asyncio.Task | None = None
        self._admin: Client | None = None
        self.listeners: list[Callable[[], None]] = []

    async def start(self) -> None:
        self.runtime = await Runtime.create(self.runtime_config)
        self._watch = asyncio.create_task(self._watch_cards(), name=f"pool {self.namespace}")
        await asyncio.sleep(0)

    async def prefill_admin(self) -> Client:
        """The admin endpoint of this pool's prefill workers (to release pinned KV)."""
        if self._admin is None:
            assert self.runtime is not None
            endpoint = EndpointName(self.namespace, PREFILL_COMPONENT, "admin")
            self._admin = await self.runtime.client(endpoint, AdminResponse)
        return self._admin

    async def close(self) -> None:
        if self._watch is not None:
            await cancel_and_wait([self._watch])
        if self._admin is not None:
            await self._admin.close()
        routes, self.routes = list(self.routes.values()), {}
        for route in routes:
            await self._close_route(route)
        if self.runtime is not None:
            await self.runtime.shutdown()

    # -- discovery -------------------------------------------------------------------

    async def _watch_cards(self) -> None:
        assert self.runtime is not None
        async for event in self.runtime.discovery.watch(models_prefix(self.namespace)):
            try:
                if event.kind == "put":
                    self._on_put(event.key, event.value)
                else:
                    await self._on_delete(event.key)
            except Exception:
                log.exception("pool %s: failed to handle %s", self.namespace, event.key)

    def _on_put(self, key: str, value: bytes) -> None:
        try:
            card = decode(value, ModelCard)
            endpoint = _endpoint_of(key)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            log.warning("pool %s: ignoring malformed model card %s: %s", self.namespace, key, exc)
            return
        if endpoint.namespace != self.namespace:
            return
        slot = (card.name, role_group(card))
        route = self.routes.get(slot)
        if route is None:
            route = self.routes[slot] = PoolRoute(card, endpoint)
            route.router = asyncio.create_task(self._build(route), name=f"router {slot}")
            log.info("pool %s: model %s (%s workers) appeared", self.namespace, *slot)
        route.keys.add(key)
        self._key_route[key] = slot
        self._signal()

    async def _build(self, route: PoolRoute) -> Router:
        assert self.runtime is not None
        client = await self.runtime.client(route.endpoint, EngineOutput)
        config = self.router_config
        if route.card.role == "prefill":
            # As the frontend's prefill router: replicas share only decode-side load.
            config = dataclasses.replace(config, router_replica_sync=False)
        router = Router(self.runtime, client, route.card, config, registry=self.registry)
        await router.start()
        return router

    async def _on_delete(self, key: str) -> None:
        slot = self._key_route.pop(key, None)
        route = self.routes.get(slot) if slot else None
        if route is None:
            return
        route.keys.discard(key)
        if not route.keys:
            del self.routes[slot]
            log.info("pool %s: model %s (%s workers) is gone", self.namespace, *slot)
            await self._close_route(route)
        self._signal()

    @staticmethod
    async def _close_route(route: PoolRoute) -> None:
        async def close(router: Router) -> None:
            await router.close()
            await router.client.close()

        await close_built(route.router, close)

    def _signal(self) -> None:
        for listener in self.listeners:
            listener()

    # -- queries ---------------------------------------------------------------------

    def models(self) -> dict[str, ModelCard]:
        """Models this pool serves whole requests for (aggregated or decode workers)."""
        return {name: r.card for (name, group), r in self.routes.items() if group == "serve"}

    async def router(self, model: str, group: str = "serve") -> Router | None:
        """The local router of `model`'s workers of `group`, once built; None if none."""
        route = self.routes.get((model, group))
        if route is None or route.router is None:
            return None
        with contextlib.suppress(Exception):
            return await asyncio.shield(route.router)
        return None

    def live_workers(self, model: str, group: str = "serve") -> list[int]:
        route = self.routes.get((model, group))
        router = route.ready() if route is not None else None
        return router.client.instance_ids() if router is not None else []

    @staticmethod
    def state(router: Router | None) -> str:
        """ "empty" (no live worker), "busy" (every worker over its busy threshold) or
        "ok"."""
        if router is None:
            return "empty"
        keys = router.candidates()
        if not keys:
            return "empty"
        thresholds = router.thresholds
        if thresholds.enabled and all(is_busy(router.load.load(k), thresholds) for k in keys):
            return "busy"
        return "ok"
