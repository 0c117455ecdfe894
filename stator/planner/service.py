"""The planner process: every interval, observe (frontend metrics or Prometheus, and the
workers' load reports), tick the pure `Planner`, apply its decisions with a connector.
Every observation can be recorded (JSON lines) and replayed through the core offline
(`stator planner --replay FILE`) to the same decisions.

When the metrics source does not answer, the planner keeps running and holds the fleet
(`health`): it retries with backoff and ticks again once it has a full interval of
traffic to look at."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec
from prometheus_client import CollectorRegistry, Gauge

from stator.config import option
from stator.planner.config import PlannerConfig
from stator.planner.core import Decision, Observation, Planner, RoleObservation, WorkerLoad
from stator.planner.health import Backoff, ObservationHealth
from stator.planner.observe import (
    FrontendScraper,
    ObservationUnavailable,
    PrometheusReader,
    Traffic,
)
from stator.planner.profile import PerfProfile
from stator.protocols import LoadReport
from stator.runtime import Runtime, RuntimeConfig
from stator.runtime.names import EndpointName
from stator.runtime.tasks import cancel_and_wait

log = logging.getLogger(__name__)

LOAD_TOPIC = "load"
COMPONENT = {"aggregated": "backend", "decode": "backend", "prefill": "prefill"}


@dataclass
class PlannerServiceConfig:
    connector: str = option(
        "local",
        "Who applies decisions: local (worker processes here), kubernetes, or none",
        choices=["local", "kubernetes", "none"],
    )
    pools: list[str] = option([], "Pools (namespaces) to plan (default: --namespace)")
    roles: list[str] = option(
        ["aggregated"], "Roles to plan in each pool: aggregated, or prefill,decode"
    )
    frontend_url: list[str] = option(
        [], "Frontends whose /metrics the planner reads (comma-separated)", metavar="URLS"
    )
    prometheus_url: str | None = option(
        None, "Read the frontends' metrics from this Prometheus instead", metavar="URL"
    )
    model: str | None = option(None, "Only this model's traffic (default: all)")
    worker_args: str = option(
        "",
        "local connector: the flags of each worker it starts (one string, shell syntax; "
        "--namespace and --role are added)",
    )
    gpus: list[str] = option([], "local connector: GPU ids to hand out to workers")
    log_dir: str | None = option(None, "local connector: directory for the workers' logs")
    k8s_namespace: str | None = option(
        None, "kubernetes connector: the namespace of the Deployments (default: the pod's)"
    )
    k8s_pool_label: bool = option(
        False, "kubernetes connector: also select Deployments by the stator-pool label"
    )
    record: str | None = option(
        None, "Append every observation here (JSON lines) for --replay", metavar="FILE"
    )
    replay: str | None = option(
        None,
        "Replay a recorded observation log through the planner and print its decisions",
        metavar="FILE",
    )
    metrics_port: int = option(
        0,
        "Serve the planner's status on this port (0: off): /metrics, /live, and /health "
        "(503 while it cannot read its traffic)",
    )


class PlannerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        labels = ["pool", "role"]
        r = self.registry
        self.workers = Gauge("stator_planner_workers", "Workers now", labels, registry=r)
        self.desired = Gauge("stator_planner_desired_workers", "Workers wanted", labels, registry=r)
        self.rps = Gauge("stator_planner_predicted_rps", "Predicted req/s", labels, registry=r)
        self.correction = Gauge(
            "stator_planner_correction", "Observed / modelled latency", labels, registry=r
        )

    def record(self, d: Decision) -> None:
        self.workers.labels(d.pool, d.role).set(d.current)
        self.desired.labels(d.pool, d.role).set(d.desired)
        if d.predicted_rps is not None:
            self.rps.labels(d.pool, d.role).set(d.predicted_rps)
        if d.correction is not None:
            self.correction.labels(d.pool, d.role).set(d.correction)


class PoolWatch:
    """A pool's live workers per role (discovery) and their latest load reports."""

    def __init__(self, runtime: Runtime, pool: str, roles: list[str]) -> None:
        self.runtime = runtime
        self.pool = pool
        self.roles = roles
        self.clients: dict[str, object] = {}
        self.loads: dict[int, LoadReport] = {}
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        for role in self.roles:
            name = EndpointName(self.pool, COMPONENT[role], "generate")
            self.clients[role] = await self.runtime.client(name)
        self._task = asyncio.create_task(self._consume(), name=f"loads {self.pool}")

    async def _consume(self) -> None:
        async for report in self.runtime.subscribe(LOAD_TOPIC, LoadReport):
            self.loads[report.worker_id] = report

    def ready(self, role: str) -> list[int]:
        return self.clients[role].instance_ids()  # type: ignore[attr-defined]

    def worker_loads(self, role: str, context_length: int = 0) -> list[WorkerLoad]:
        out = []
        for wid in self.ready(role):
            report = self.loads.get(wid)
            if report is None:
                continue
            total = report.total_kv_blocks or 0
            out.append(
                WorkerLoad(
                    kv_usage=report.active_kv_blocks / total if total else 0.0,
                    queued_prefill_tokens=report.queued_prefill_tokens,
                    waiting=report.num_waiting,
                    context_length=context_length,
                )
            )
        return out

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
        for client in self.clients.values():
            await client.close()  # type: ignore[attr-defined]


class PlannerService:
    def __init__(
        self,
        config: PlannerConfig,
        service: PlannerServiceConfig,
        runtime_config: RuntimeConfig,
        connector,
        reader: FrontendScraper | PrometheusReader | None,
        profile: PerfProfile | None = None,
        metrics: PlannerMetrics | None = None,
    ) -> None:
        self.config = config
        self.service = service
        self.runtime_config = runtime_config
        self.connector = connector
        self.reader = reader
        self.planner = Planner(config, profile)
        self.metrics = metrics or PlannerMetrics()
        self.health = ObservationHealth(self.metrics.registry)
        self.pools = service.pools or [runtime_config.namespace]
        self.watches: dict[str, PoolWatch] = {}
        self.decisions: list[Decision] = []
        self.observations: list[Observation] = []
        self._runtimes: list[Runtime] = []

    async def start(self) -> None:
        for pool in self.pools:
            runtime = await Runtime.create(dataclasses.replace(self.runtime_config, namespace=pool))
            self._runtimes.append(runtime)
            watch = PoolWatch(runtime, pool, self.service.roles)
            await watch.start()
            self.watches[pool] = watch
            if self.connector is not None and not self.config.advisory:
                for role in self.service.roles:
                    try:
                        have = await self.connector.current(pool, role)
                        if have < self.config.min_workers:
                            await self.connector.scale(pool, role, self.config.min_workers)
                    except Exception:  # e.g. the Kubernetes API: the loop's ticks retry
                        log.exception("cannot bring %s/%s to its minimum yet", pool, role)

    async def close(self) -> None:
        for watch in self.watches.values():
            await watch.close()
        for runtime in self._runtimes:
            await runtime.shutdown()
        if self.reader is not None:
            await self.reader.close()

    async def observe(self, interval: float) -> Observation | None:
        """None when the reader only took its baseline (nothing to plan on yet); raises
        `ObservationUnavailable` when the metrics source does not answer."""
        traffic: Traffic | None = Traffic(0, 0.0, 0.0, None, None, {})
        if isinstance(self.reader, PrometheusReader):
            traffic = await self.reader.read(interval)
        elif self.reader is not None:
            traffic = await self.reader.read()
        if traffic is None:
            return None
        roles = []
        for pool in self.pools:
            watch = self.watches[pool]
            if len(self.pools) > 1 and traffic.pool_requests:
                requests = round(traffic.pool_requests.get(pool, 0.0))
            else:
                requests = traffic.requests
            for role in self.service.roles:
                ready = watch.ready(role)
                workers = await self.connector.current(pool, role) if self.connector else len(ready)
                roles.append(
                    RoleObservation(
                        pool=pool,
                        role=role,
                        workers=workers,
                        ready=len(ready),
                        requests=requests,
                        isl=traffic.isl,
                        osl=traffic.osl,
                        isl_p90=traffic.isl_p90,
                        ttft_p90_ms=traffic.ttft_p90_ms,
                        itl_p90_ms=traffic.itl_p90_ms,
                        loads=watch.worker_loads(role),
                    )
                )
        return Observation(time=time.monotonic(), interval=interval, roles=roles)

    async def step(self, interval: float) -> list[Decision]:
        observation = await self.observe(interval)
        if observation is None:
            return []
        self.observations.append(observation)
        if self.service.record:
            with Path(self.service.record).open("ab") as f:
                f.write(msgspec.json.encode(observation) + b"\n")
        decisions = self.planner.tick(observation)
        for d in decisions:
            self.metrics.record(d)
            self.decisions.append(d)
            if d.changed:
                log.info(
                    "%s/%s: %d -> %d workers (%s)", d.pool, d.role, d.current, d.desired, d.reason
                )
                if self.connector is not None and not self.config.advisory:
                    await self.connector.scale(d.pool, d.role, d.desired)
        return decisions

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Tick every adjustment interval until `stop` is set (or forever). A read that
        fails is retried with backoff (1 s, doubling, at most the interval) and never ends
        the loop; the interval a tick plans on is the time since the last good read."""
        stop = stop or asyncio.Event()
        interval = self.config.adjustment_interval
        backoff = Backoff(first=min(1.0, interval), cap=interval)
        last = time.monotonic()
        # Frontend counters need a baseline before the first interval can be measured.
        delay = 0.0 if isinstance(self.reader, FrontendScraper) else interval
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                return
            now = time.monotonic()
            try:
                await self.step(now - last)
            except ObservationUnavailable as exc:
                delay = backoff.next()
                self.health.failed(now, str(exc), delay)
                continue
            except Exception:
                log.exception("planner step failed; trying again next interval")
            else:
                self.health.succeeded(now)
                backoff.reset()
            last, delay = now, interval


def build_connector(service: PlannerServiceConfig, gpus_per_worker: int, pools: list[str]):
    if service.connector == "none":
        return None
    if service.connector == "kubernetes":
        from stator.planner.connectors.kubernetes import KubernetesConnector

        return KubernetesConnector(service.k8s_namespace, pool_label=service.k8s_pool_label)
    from stator.planner.connectors.local import LocalConnector

    if not service.worker_args:
        raise ValueError("--connector local needs --worker-args (the flags of each worker)")
    args = shlex.split(service.worker_args)
    commands = {(pool, role): args for pool in pools for role in service.roles}
    return LocalConnector(
        commands,
        gpus=service.gpus,
        gpus_per_worker=gpus_per_worker,
        log_dir=Path(service.log_dir) if service.log_dir else None,
    )


def build_reader(service: PlannerServiceConfig):
    if service.prometheus_url:
        return PrometheusReader(service.prometheus_url, service.model)
    if service.frontend_url:
        return FrontendScraper(service.frontend_url, service.model)
    return None
