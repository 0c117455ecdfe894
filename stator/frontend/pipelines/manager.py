"""`ModelManager`: which models this frontend serves, learned from discovery.

Workers publish a `ModelCard` under `v1/models/{ns}/{component}/{endpoint}/{instance:x}`.
A model appears when the first card naming it appears (its pipeline is built then) and
disappears when the last one goes. Cards of prefill-only workers do not make a model
servable on their own: the router finds prefill workers itself.

With a `RouteSource` (the global router, built by the CLI: the frontend does not import
it), models come from the source instead of this namespace's cards, and each pipeline
routes through the source's router for that model.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from stator.frontend.pipelines.pipeline import ModelPipeline
from stator.protocols import ModelCard, decode
from stator.router import RouterConfig
from stator.runtime import Runtime
from stator.runtime.names import EndpointName, models_prefix
from stator.runtime.tasks import cancel_and_wait, close_built

log = logging.getLogger(__name__)

PipelineFactory = Callable[[Runtime, ModelCard, EndpointName], "asyncio.Future[ModelPipeline]"]


def endpoint_from_key(key: str) -> EndpointName:
    """`v1/models/ns/comp/ep/id[/suffix]` -> `ns.comp.ep`."""
    parts = key.split("/")
    if len(parts) < 6:
        raise ValueError(f"not a model-card key: {key}")
    return EndpointName(parts[2], parts[3], parts[4])


class RouteSource(Protocol):
    def models(self) -> dict[str, ModelCard]: ...

    def changed_event(self) -> asyncio.Event: ...

    def model_router(self, model: str) -> Any: ...


@dataclass
class ModelEntry:
    name: str
    card: ModelCard
    endpoint: EndpointName
    keys: set[str] = field(default_factory=set)
    created: int = 0
    # Built once, by the first card; requests arriving meanwhile wait for it.
    pipeline: asyncio.Task[ModelPipeline] | None = None
    router: Any = None  # from a RouteSource

    def instance_ids(self) -> set[int]:
        """The workers that publish this model's card (key `.../{instance:x}[/suffix]`)."""
        out = set()
        for key in self.keys:
            try:
                out.add(int(key.split("/")[5], 16))
            except (IndexError, ValueError):
                continue
        return out


class ModelManager:
    def __init__(
        self,
        runtime: Runtime,
        router_config: RouterConfig,
        metrics=None,
        routes: RouteSource | None = None,
        processor: str = "stator",
    ) -> None:
        self.runtime = runtime
        self.processor = processor
        self.routes = routes
        self.router_config = router_config
        self.metrics = metrics
        self.models: dict[str, ModelEntry] = {}
        self._key_model: dict[str, str] = {}
        self._watch_task: asyncio.Task | None = None
        self._changed = asyncio.Event()

    async def start(self) -> None:
        if self._watch_task is None:
            watch = self._watch() if self.routes is None else self._follow(self.routes)
            self._watch_task = asyncio.create_task(watch, name="model-manager watch")
            # Let the watch read the current snapshot before the first request.
            await asyncio.sleep(0)

    async def _watch(self) -> None:
        prefix = models_prefix(self.runtime.namespace)
        async for event in self.runtime.discovery.watch(prefix):
            try:
                if event.kind == "put":
                    self._on_put(event.key, event.value)
                else:
                    await self._on_delete(event.key)
            except Exception:
                log.exception("failed to handle model-card event for %s", event.key)

    async def _follow(self, routes: RouteSource) -> None:
        """Mirror the route source's models."""
        while True:
            changed = routes.changed_event()
            models = routes.models()
            for name, card in models.items():
                if name not in self.models:
                    endpoint = EndpointName(self.runtime.namespace, "global_router", "generate")
                    entry = ModelEntry(name, card, endpoint, created=int(self.runtime.started_at))
                    entry.router = routes.model_router(name)
                    entry.pipeline = asyncio.create_task(
                        self._build(entry), name=f"pipeline {name}"
                    )
                    self.models[name] = entry
                    log.info("model %s appeared in the global router's pools", name)
                    self._signal()
            for name in [n for n in self.models if n not in models]:
                entry = self.models.pop(name)
                log.info("model %s disappeared (no pool serves it)", name)
                self._signal()
                await self._close_entry(entry)
            await changed.wait()

    def _on_put(self, key: str, value: bytes) -> None:
        try:
            card = decode(value, ModelCard)
            endpoint = endpoint_from_key(key)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            log.warning("ignoring malformed model card %s: %s", key, exc)
            return
        if card.role == "prefill":
            log.debug("model card %s is a prefill worker's; not a model entry point", key)
            return
        entry = self.models.get(card.name)
        if entry is None:
            entry = ModelEntry(card.name, card, endpoint, created=int(self.runtime.started_at))
            entry.pipeline = asyncio.create_task(self._build(entry), name=f"pipeline {card.name}")
            self.models[card.name] = entry
            log.info("model %s appeared (served at %s)", card.name, endpoint)
            self._signal()
        entry.keys.add(key)
        self._key_model[key] = card.name

    async def _build(self, entry: ModelEntry) -> ModelPipeline:
        # A LoRA adapter goes only to the workers that loaded it (that publish its card).
        allowed = entry.instance_ids if entry.card.base_model else None
        pipeline = await ModelPipeline.create(
            self.runtime,
            entry.card,
            entry.endpoint,
            self.router_config,
            self.metrics,
            allowed_workers=allowed,
            router=entry.router,
            processor=self.processor,
        )
        log.info("pipeline for %s ready", entry.name)
        return pipeline

    async def _on_delete(self, key: str) -> None:
        name = self._key_model.pop(key, None)
        entry = self.models.get(name) if name else None
        if entry is None:
            return
        entry.keys.discard(key)
        if entry.keys:
            return
        del self.models[entry.name]
        log.info("model %s disappeared (its last worker is gone)", entry.name)
        self._signal()
        await self._close_entry(entry)

    @staticmethod
    async def _close_entry(entry: ModelEntry) -> None:
        await close_built(entry.pipeline, lambda pipeline: pipeline.close())

    def _signal(self) -> None:
        if self.metrics is not None:
            self.metrics.models.set(len(self.models))
        self._changed.set()
        self._changed = asyncio.Event()

    # -- queries ---------------------------------------------------------------------

    def names(self) -> list[str]:
        return sorted(self.models)

    async def pipeline(self, name: str) -> ModelPipeline | None:
        """The ready pipeline of model `name`, or None when no worker serves it. Raises
        what building the pipeline raised (bad model files)."""
        entry = self.models.get(name)
        if entry is None or entry.pipeline is None:
            return None
        return await asyncio.shield(entry.pipeline)

    def live_instances(self) -> dict[str, list[int]]:
        """Live worker ids per model (models whose pipeline is still building: [])."""
        out: dict[str, list[int]] = {}
        for name, entry in self.models.items():
            task = entry.pipeline
            if task is not None and task.done() and not task.cancelled() and not task.exception():
                out[name] = task.result().client.instance_ids()
            else:
                out[name] = []
        return out

    async def wait_for_model(self, name: str, timeout: float = 30.0) -> ModelPipeline:
        """Wait until `name` is served (for tests and `stator run`)."""
        async with asyncio.timeout(timeout):
            while name not in self.models:
                await self._changed.wait()
            pipeline = await self.pipeline(name)
            assert pipeline is not None
            return pipeline

    async def close(self) -> None:
        if self._watch_task is not None:
            await cancel_and_wait([self._watch_task])
            self._watch_task = None
        entries, self.models = list(self.models.values()), {}
        for entry in entries:
            await self._close_entry(entry)
