"""`stator_worker_*` Prometheus metrics of one worker host.

Each host has its own registry, so that `stator run` can hold several workers in one
process without their metrics colliding; the status server serves that registry.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from stator.protocols import LoadReport

# The key of `Engine.metrics()` that becomes the `stator_worker_preemptions_total` counter
# (a count since the engine started), the same for every engine.
PREEMPTIONS = "preemptions_total"


class _LoadCollector(Collector):
    """Reads the engine's load and extra gauges at scrape time (never stale)."""

    def __init__(
        self, model: str, load: Callable[[], list[LoadReport]], extra: Callable[[], dict]
    ) -> None:
        self.model = model
        self._load = load
        self._extra = extra

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            reports = self._load()
            extra = self._extra()
        except Exception:  # a broken engine must not break the scrape
            return
        fams = {
            "kv_usage": GaugeMetricFamily(
                "stator_worker_kv_usage",
                "Fraction of KV blocks in use",
                labels=["model", "dp_rank"],
            ),
            "kv_active_blocks": GaugeMetricFamily(
                "stator_worker_kv_active_blocks", "KV blocks in use", labels=["model", "dp_rank"]
            ),
            "kv_total_blocks": GaugeMetricFamily(
                "stator_worker_kv_total_blocks", "KV blocks in all", labels=["model", "dp_rank"]
            ),
            "waiting": GaugeMetricFamily(
                "stator_worker_waiting_requests", "Requests queued", labels=["model", "dp_rank"]
            ),
            "running": GaugeMetricFamily(
                "stator_worker_running_requests", "Requests running", labels=["model", "dp_rank"]
            ),
        }
        for r in reports:
            labels = [self.model, str(r.dp_rank)]
            usage = r.active_kv_blocks / r.total_kv_blocks if r.total_kv_blocks else 0.0
            fams["kv_usage"].add_metric(labels, usage)
            fams["kv_active_blocks"].add_metric(labels, r.active_kv_blocks)
            fams["kv_total_blocks"].add_metric(labels, r.total_kv_blocks)
            fams["waiting"].add_metric(labels, r.num_waiting)
            fams["running"].add_metric(labels, r.num_running)
        yield from fams.values()
        preemptions = extra.get(PREEMPTIONS)
        if isinstance(preemptions, int | float):
            fam = CounterMetricFamily(
                "stator_worker_preemptions",
                "Running requests the engine preempted (KV freed, recomputed later)",
                labels=["model"],
            )
            fam.add_metric([self.model], float(preemptions))
            yield fam
        for name, value in sorted(extra.items()):
            if name == PREEMPTIONS:
                continue
            if isinstance(value, int | float):
                fam = GaugeMetricFamily(
                    f"stator_worker_engine_{name}", f"Engine gauge {name}", labels=["model"]
                )
                fam.add_metric([self.model], float(value))
                yield fam


class WorkerMetrics:
    def __init__(
        self,
        model: str,
        load: Callable[[], list[LoadReport]],
        extra: Callable[[], dict] = dict,
    ) -> None:
        self.registry = CollectorRegistry()
        self.started_at = time.monotonic()
        self.requests = Counter(
            "stator_worker_requests",
            "Generate requests received",
            ["model"],
            registry=self.registry,
        ).labels(model)
        self.errors = Counter(
            "stator_worker_errors",
            "Generate requests that ended in an engine error",
            ["model"],
            registry=self.registry,
        ).labels(model)
        self.aborts = Counter(
            "stator_worker_aborts",
            "Generate requests the caller abandoned before they finished",
            ["model"],
            registry=self.registry,
        ).labels(model)
        self.inflight = Gauge(
            "stator_worker_inflight_requests",
            "Generate requests being streamed",
            ["model"],
            registry=self.registry,
        ).labels(model)
        self.model_load_seconds = Gauge(
            "stator_worker_model_load_seconds",
            "Seconds the engine took to start (load weights, allocate KV)",
            ["model"],
            registry=self.registry,
        ).labels(model)
        uptime = Gauge(
            "stator_worker_uptime_seconds",
            "Seconds since the worker host was created",
            ["model"],
            registry=self.registry,
        ).labels(model)
        uptime.set_function(lambda: time.monotonic() - self.started_at)
        self.registry.register(_LoadCollector(model, load, extra))
