"""Global router metrics (`stator_global_router_*`): where requests went and why."""

from __future__ import annotations

import weakref

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, GlobalRouterMetrics] = (
    weakref.WeakKeyDictionary()
)


class GlobalRouterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            "stator_global_router_decisions_total",
            "Requests sent to a pool (stage: the prefill or decode grid named it, or disagg: "
            "prompt at prefill_pool's prefill workers, output at pool; reason: grid, "
            "priority override, or fallback from the grid's pool)",
            ["model", "stage", "pool", "prefill_pool", "reason"],
            registry=registry,
        )
        self.fallbacks = Counter(
            "stator_global_router_fallbacks_total",
            "Pools passed over for a request (why: empty = no live worker for the model, "
            "busy = every worker over its busy threshold, failed = the pool's router "
            "failed the request before its first output)",
            ["model", "pool", "why"],
            registry=registry,
        )
        self.unserved = Counter(
            "stator_global_router_unserved_total",
            "Requests no pool could serve",
            ["model"],
            registry=registry,
        )
        self.pool_workers = Gauge(
            "stator_global_router_pool_workers",
            "Live workers per pool, model and role",
            ["pool", "model", "role"],
            registry=registry,
        )


def global_router_metrics(registry: CollectorRegistry | None = None) -> GlobalRouterMetrics:
    registry = registry if registry is not None else REGISTRY
    metrics = _by_registry.get(registry)
    if metrics is None:
        metrics = _by_registry[registry] = GlobalRouterMetrics(registry)
    return metrics
