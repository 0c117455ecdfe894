"""`GlobalRouter`: picks a pool for each request from the grids, then lets that pool's
local router pick the worker.

The prefill grid (ISL × TTFT target) picks where the prompt is computed. A pool of
aggregated workers there serves the whole request. Without prefill pools (or when none
of them can serve) the decode grid (context length × ITL target) picks the pool.

Fallback (what Dynamo lacks): a pool with no live worker for the model, or whose every
worker is over its busy threshold, is passed over for the nearest pool in the grid
(`selection.fallback_order`); a pool whose router fails the request before its first
output (its workers died meanwhile, or it is overloaded) is passed over the same way.
Only when every pool is busy does the request wait in (or be rejected by) the queue of
its own grid's pool. Each decision and each pool passed over is a metric.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from stator.global_router.config import Grid, PoolSelectionConfig
from stator.global_router.metrics import global_router_metrics
from stator.global_router.pools import Pool
from stator.global_router.selection import fallback_order, select
from stator.protocols import EngineOutput, EngineRequest, ModelCard
from stator.router import Overloaded, Router, RouterConfig
from stator.router.migration import migrating
from stator.router.router import prompt_length
from stator.runtime import Migratable, NoInstances, RuntimeConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Candidate:
    """A pool to try for a request, in order."""

    pool: Pool
    stage: str  # "prefill" or "decode": the grid that named it
    reason: str  # "grid", "priority" or "fallback"


class GlobalRouter:
    def __init__(
        self,
        config: PoolSelectionConfig,
        runtime_config: RuntimeConfig,
        router_config: RouterConfig,
        *,
        default_ttft_ms: float | None = None,
        default_itl_ms: float | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.config = config
        self.default_ttft_ms = default_ttft_ms
        self.default_itl_ms = default_itl_ms
        self.router_config = router_config
        self.metrics = global_router_metrics(registry)
        self.pools = {
            ns: Pool(ns, runtime_config, router_config, registry) for ns in config.namespaces
        }
        self.prefill_pools = [self.pools[ns] for ns in config.prefill_namespaces]
        self.decode_pools = [self.pools[ns] for ns in config.decode_namespaces]
        self._changed = asyncio.Event()
        for pool in self.pools.values():
            pool.listeners.append(self._signal)

    def _signal(self) -> None:
        for pool in self.pools.values():
            for model, group in pool.routes:
                gauge = self.metrics.pool_workers.labels(pool.namespace, model, group)
                # Read at scrape time (a gone route reads 0).
                gauge.set_function(lambda p=pool, m=model, g=group: len(p.live_workers(m, g)))
        self._changed.set()
        self._changed = asyncio.Event()

    def changed_event(self) -> asyncio.Event:
        """An event set when a model card next appears or goes in any pool."""
        return self._changed

    async def start(self) -> None:
        for pool in self.pools.values():
            await pool.start()

    async def close(self) -> None:
        for pool in self.pools.values():
            await pool.close()

    def models(self) -> dict[str, ModelCard]:
        """Every model some pool serves, with one of its cards."""
        out: dict[str, ModelCard] = {}
        for pool in self.pools.values():
            for name, card in pool.models().items():
                out.setdefault(name, card)
        return out

    def live_workers(self, model: str) -> list[int]:
        return sorted({w for pool in self.pools.values() for w in pool.live_workers(model)})

    def model_router(self, model: str) -> ModelRoutes:
        """A router-shaped view of one model across the pools (what a frontend pipeline
        calls `router`)."""
        return ModelRoutes(self, model)

    # -- selection -------------------------------------------------------------------

    def plan(self, request: EngineRequest) -> list[Candidate]:
        """The pools to try for `request`, best first (each once)."""
        hints = request.routing
        length = prompt_length(request)
        out: list[Candidate] = []
        stages = (
            ("prefill", self.config.prefill_grid, self.prefill_pools, "ttft"),
            ("decode", self.config.decode_grid, self.decode_pools, "itl"),
        )
        for stage, grid, pools, target in stages:
            if grid is None:
                continue
            y = self._target(hints, target, grid)
            selection = select(grid, length, y, request.priority)
            for n, index in enumerate(fallback_order(grid, selection, len(pools))):
                reason = selection.reason if n == 0 else "fallback"
                if all(c.pool is not pools[index] for c in out):
                    out.append(Candidate(pools[index], stage, reason))
        return out

    def _target(self, hints, which: str, grid: Grid) -> float | None:
        value = getattr(hints, f"{which}_target_ms", None) if hints is not None else None
        if value is None:
            value = self.default_ttft_ms if which == "ttft" else self.default_itl_ms
        return value  # None: the grid's midpoint

    # -- serving ---------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        """Stream `request` from the best pool that can serve it. A pool that fails it
        (its workers died and its own router found no other) hands it on to the next
        pool, mid-stream too: the continuation carries the tokens generated so far
        (`stator.router.migration`), so the caller sees one unbroken stream."""
        plan = self.plan(request)

        def on_migrate(ongoing: bool) -> None:
            log.info(
                "request %s: moving to another pool (ongoing: %s)", request.request_id, ongoing
            )

        def attempt(current: EngineRequest, tried: set[int]) -> AsyncIterator[EngineOutput]:
            return self._attempt(current, plan, tried)

        async for output in migrating(request, attempt, len(plan), on_migrate):
            yield output

    async def _attempt(
        self, request: EngineRequest, plan: list[Candidate], tried: set[int]
    ) -> AsyncIterator[EngineOutput]:
        """One try: the first pool of `plan` not in `tried` that can serve (tried are
        plan positions). Raises `Migratable` when a pool fails the stream after its first
        output, so that `migrating` continues it in the next pool."""
        model = request.model
        busy: list[tuple[int, Router]] = []
        last_error: Exception | None = None
        for n, candidate in enumerate(plan):
            if n in tried:
                continue
            router = await candidate.pool.router(model)
            state = candidate.pool.state(router)
            if state != "ok":
                if state == "busy" and router is not None:
                    busy.append((n, router))
                else:
                    tried.add(n)
                self.metrics.fallbacks.labels(model, candidate.pool.namespace, state).inc()
                continue
            assert router is not None
            tried.add(n)
            stream = router.generate(request)
            try:
                first = await anext(stream)
            except (NoInstances, Overloaded, Migratable) as exc:
                await stream.aclose()
                last_error = exc
                self._failed(request, candidate, exc)
                continue
            except StopAsyncIteration:
                return
            self._decided(request, candidate, "fallback" if n else candidate.reason)
            async for output in self._rest(request, candidate, first, stream):
                yield output
            return
        if busy:
            # Every pool with workers is busy: wait in the queue of the best of them.
            n, router = busy[0]
            tried.add(n)
            self._decided(request, plan[n], "fallback" if n else plan[n].reason)
            async for output in router.generate(request):
                yield output
            return
        self.metrics.unserved.labels(model).inc()
        if last_error is not None and not isinstance(last_error, Migratable):
            raise last_error
        raise NoInstances(f"no pool has a live worker for {model}") from last_error

    async def _rest(self, request, candidate, first, stream) -> AsyncIterator[EngineOutput]:
        try:
            yield first
            try:
                async for output in stream:
                    yield output
            except (NoInstances, Overloaded) as exc:
                # The pool's router could not continue the stream on its own workers.
                self._failed(request, candidate, exc)
                raise Migratable(f"pool {candidate.pool.namespace}: {exc}") from exc
            except Migratable as exc:
                self._failed(request, candidate, exc)
                raise
        finally:
            await stream.aclose()

    def _failed(self, request: EngineRequest, candidate: Candidate, exc: Exception) -> None:
        log.info(
            "request %s: pool %s failed it (%s); trying the next pool",
            request.request_id,
            candidate.pool.namespace,
            exc,
        )
        self.metrics.fallbacks.labels(request.model, candidate.pool.namespace, "failed").inc()

    def _decided(self, request: EngineRequest, candidate: Candidate, reason: str) -> None:
        pool = candidate.pool.namespace
        self.metrics.decisions.labels(request.model, candidate.stage, pool, reason).inc()
        log.debug(
            "request %s -> pool %s (%s, %s)", request.request_id, pool, candidate.stage, reason
        )


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
