"""Router metrics (`stator_router_*`), labelled by model.

One `RouterMetrics` per prometheus registry, shared by the routers of every model (a
metric name may be registered only once per registry).
"""

from __future__ import annotations

import weakref

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

_BLOCK_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_RATIO_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0)
_TIME_BUCKETS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0)

_by_registry: weakref.WeakKeyDictionary[CollectorRegistry, RouterMetrics] = (
    weakref.WeakKeyDictionary()
)


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            "stator_router_decisions_total",
            "Requests routed, by policy",
            ["model", "policy"],
            registry=registry,
        )
        self.overlap_blocks = Histogram(
            "stator_router_overlap_blocks",
            "Prompt blocks already cached on the chosen worker",
            ["model"],
            buckets=_BLOCK_BUCKETS,
            registry=registry,
        )
        self.predicted_hit_rate = Histogram(
            "stator_router_predicted_hit_rate",
            "Fraction of the prompt's full blocks the router expects cached on the chosen worker",
            ["model"],
            buckets=_RATIO_BUCKETS,
            registry=registry,
        )
        self.routing_seconds = Histogram(
            "stator_router_routing_seconds",
            "Time spent choosing a worker (queue wait excluded)",
            ["model"],
            buckets=_TIME_BUCKETS,
            registry=registry,
        )
        self.queue_length = Gauge(
            "stator_router_queue_length",
            "Requests waiting because every worker is busy",
            ["model"],
            registry=registry,
        )
        self.rejections = Counter(
            "stator_router_rejections_total",
            "Requests rejected because every worker was busy and the queue was full",
            ["model"],
            registry=registry,
        )
        self.migrations = Counter(
            "stator_router_migrations_total",
            "Streams moved to another worker after their worker failed "
            "(kind: new_request = before any token, ongoing_request = mid-stream)",
            ["model", "kind"],
            registry=registry,
        )
        self.disagg_requests = Counter(
            "stator_router_disagg_requests_total",
            "Where each request's prompt was computed (path: remote = a prefill worker, "
            "local = the decode worker, rejected = 503 under --enforce-disagg) and why",
            ["model", "path", "reason"],
            registry=registry,
        )
        self.prefill_workers = Gauge(
            "stator_router_prefill_workers",
            "Live prefill workers of the model (0: aggregated serving)",
            ["model"],
            registry=registry,
        )
        self.prefill_queue_tokens = Gauge(
            "stator_router_prefill_queue_tokens",
            "Prompt tokens queued on the least loaded prefill worker at the last decision",
            ["model"],
            registry=registry,
        )
        self.kv_events = Counter(
            "stator_router_kv_events_total", "KV events applied to the index", registry=registry
        )
        self.kv_resyncs = Counter(
            "stator_router_kv_resyncs_total",
            "Full KV state fetches from a worker (after a gap in its events or on discovery)",
            registry=registry,
        )


def router_metrics(registry: CollectorRegistry | None = None) -> RouterMetrics:
    registry = registry if registry is not None else REGISTRY
    metrics = _by_registry.get(registry)
    if metrics is None:
        metrics = _by_registry[registry] = RouterMetrics(registry)
    return metrics
