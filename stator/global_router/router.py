"""`GlobalRouter`: picks a pool for each request from the grids, then lets that pool's
local router pick the worker.

The prefill grid (ISL × TTFT target) picks where the prompt is computed, the decode grid
(context length × ITL target) where the output is generated:

- a prefill pool of prefill workers (`stator worker --role prefill`) computes the prompt
  and hands the request to the decode pool the decode grid picks, by the disaggregation
  protocol of `stator.router.disagg` (the same `DisaggRouter` a frontend uses inside one
  namespace, here over a prefill pool's router and a decode pool's router);
- a prefill pool of aggregated workers serves the whole request;
- without prefill pools (or when none can serve) the decode grid's pool serves it, with
  its own prefill workers if it has some.

Fallback (what Dynamo lacks): a pool with no live worker for the model, or whose every
worker is over its busy threshold, is passed over for the nearest pool in the grid
(`selection.fallback_order`); a pool whose router fails the request before its first
output (its workers died meanwhile, or it is overloaded) is passed over the same way,
and one that fails mid-stream hands the continuation on. Only when every pool is busy
does the request wait in (or be rejected by) the queue of the best of them. Each
decision and each pool passed over is a metric.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from stator.global_router.config import Grid, PoolSelectionConfig
from stator.global_router.metrics import global_router_metrics
from stator.global_router.pools import Pool
from stator.global_router.selection import fallback_order, select
from stator.protocols import EngineOutput, EngineRequest, ModelCard
from stator.router import Overloaded, Router, RouterConfig
from stator.router.disagg import DisaggRouter
from stator.router.migration import migrating
from stator.router.router import prompt_length
from stator.runtime import Migratable, NoInstances, RuntimeConfig

if TYPE_CHECKING:
    from stator.global_router.model_routes import ModelRoutes

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Candidate:
    """Where to try a request: `pool` produces the output; `prefill`, when set, is the
    pool whose prefill workers compute the prompt first (disaggregated across pools)."""

    pool: Pool
    stage: str  # "prefill", "decode" (the grid that named `pool`) or "disagg"
    reason: str  # "grid", "priority" or "fallback"
    prefill: Pool | None = None


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
        # (serving router, prefill router) -> the DisaggRouter over the pair
        self._pairs: dict[tuple[Router, Router | None], DisaggRouter] = {}
        for pool in self.pools.values():
            pool.listeners.append(self._signal)

    def _signal(self) -> None:
        for pool in self.pools.values():
            for model, group in pool.routes:
                gauge = self.metrics.pool_workers.labels(pool.namespace, model, group)
                # Read at scrape time (a gone route reads 0).
                gauge.set_function(lambda p=pool, m=model, g=group: len(p.live_workers(m, g)))
        # Forget pairs whose routers a pool has closed (their model left the pool).
        live = {
            r
            for pool in self.pools.values()
            for route in pool.routes.values()
            if (r := route.ready())
        }
        for key in [
            k for k in self._pairs if k[0] not in live or (k[1] is not None and k[1] not in live)
        ]:
            del self._pairs[key]
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
        from stator.global_router.model_routes import ModelRoutes

        return ModelRoutes(self, model)

    # -- selection -------------------------------------------------------------------

    def plan(self, request: EngineRequest) -> list[Candidate]:
        """Where to try `request`, best first: for each prefill pool in its grid's order,
        that pool's prefill workers with each decode pool in the decode grid's order,
        then that pool serving alone; then each decode pool serving alone."""
        hints = request.routing
        length = prompt_length(request)
        orders: dict[str, list[tuple[Pool, str]]] = {"prefill": [], "decode": []}
        stages = (
            ("prefill", self.config.prefill_grid, self.prefill_pools, "ttft"),
            ("decode", self.config.decode_grid, self.decode_pools, "itl"),
        )
        for stage, grid, pools, target in stages:
            if grid is None:
                continue
            selection = select(grid, length, self._target(hints, target, grid), request.priority)
            for n, index in enumerate(fallback_order(grid, selection, len(pools))):
                orders[stage].append((pools[index], selection.reason if n == 0 else "fallback"))
        out: list[Candidate] = []
        seen: set[tuple[str | None, str]] = set()

        def add(candidate: Candidate) -> None:
            key = (
                candidate.prefill.namespace if candidate.prefill else None,
                candidate.pool.namespace,
            )
            if key not in seen:
                seen.add(key)
                out.append(candidate)

        for i, (p, p_reason) in enumerate(orders["prefill"]):
            for j, (d, d_reason) in enumerate(orders["decode"]):
                reason = p_reason if j == 0 else d_reason if i == 0 else "fallback"
                if d is not p:
                    add(Candidate(d, "disagg", reason, prefill=p))
            add(Candidate(p, "prefill", p_reason))
        for d, d_reason in orders["decode"]:
            add(Candidate(d, "decode", d_reason))
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

    async def _router(self, candidate: Candidate, model: str):
        """(router for the candidate or None, why not: "" | "skip" | "empty" | "busy",
        the pool to blame). `skip`: a cross-pool candidate whose prefill pool has no
        prefill workers for the model at all (it serves whole requests): not a fallback."""
        serve = await candidate.pool.router(model, "serve")
        if candidate.prefill is not None:
            prefill = await candidate.prefill.router(model, "prefill")
            if prefill is None:
                return None, "skip", candidate.prefill
            state = candidate.prefill.state(prefill)
            if state != "ok":
                return None, state, candidate.prefill
            prefill_pool = candidate.prefill
        else:
            prefill_pool = candidate.pool
            prefill = await prefill_pool.router(model, "prefill")
        state = candidate.pool.state(serve)
        if state == "empty":
            return None, state, candidate.pool
        assert serve is not None
        router = await self._disagg(serve, prefill, prefill_pool)
        return router, "" if state == "ok" else state, candidate.pool

    async def _disagg(self, serve: Router, prefill: Router | None, prefill_pool: Pool):
        """The `DisaggRouter` over a serving router and a prefill router (which may be in
        another pool), built once per pair; without prefill workers it is the serving
        router alone."""
        key = (serve, prefill)
        router = self._pairs.get(key)
        if router is None:
            admin = await prefill_pool.prefill_admin() if prefill is not None else None
            router = DisaggRouter(serve, prefill, self.router_config, prefill_admin=admin)
            await router.start()
            self._pairs[key] = router
        return router

    async def _attempt(
        self, request: EngineRequest, plan: list[Candidate], tried: set[int]
    ) -> AsyncIterator[EngineOutput]:
        """One try: the first candidate of `plan` not in `tried` that can serve (tried are
        plan positions). Raises `Migratable` when a pool fails the stream after its first
        output, so that `migrating` continues it with the next candidate."""
        model = request.model
        busy: list[tuple[int, DisaggRouter]] = []
        last_error: Exception | None = None
        passed_over = False
        for n, candidate in enumerate(plan):
            if n in tried:
                continue
            router, why, blamed = await self._router(candidate, model)
            if why == "skip":
                tried.add(n)
                continue
            if why:
                if why == "busy" and router is not None:
                    busy.append((n, router))
                else:
                    tried.add(n)
                passed_over = True
                self.metrics.fallbacks.labels(model, blamed.namespace, why).inc()
                continue
            assert router is not None
            tried.add(n)
            stream = router.generate(request)
            try:
                first = await anext(stream)
            except (NoInstances, Overloaded, Migratable) as exc:
                await stream.aclose()
                last_error = exc
                passed_over = True
                self._failed(request, candidate, exc)
                continue
            except StopAsyncIteration:
                return
            self._decided(request, candidate, "fallback" if passed_over else candidate.reason)
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
        prefill = candidate.prefill.namespace if candidate.prefill is not None else ""
        self.metrics.decisions.labels(request.model, candidate.stage, pool, prefill, reason).inc()
        log.debug(
            "request %s -> pool %s (%s, %s)", request.request_id, pool, candidate.stage, reason
        )
