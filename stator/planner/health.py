"""Whether the planner can see its traffic, and how it says so.

A planner whose metrics source (the frontends, or Prometheus) is down must not exit: in
Kubernetes that is a crash loop, and a planner that restarts forgets its history. Nor may
it plan on what it cannot see: zero observed requests would read as zero load and scale
every pool to its minimum. So while blind it holds the fleet as it is, retries with
exponential backoff (`Backoff`), logs the outage once when it starts and once when it
ends, and reports it: `stator_planner_observation_up` 0 and `/health` 503 on its status
port (`/live` stays 200: the process is fine, restarting it would not help).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from stator.runtime.status_port import StatusPort

log = logging.getLogger(__name__)


@dataclass
class Backoff:
    """Delays between retries: `first`, doubling, at most `cap`; `reset()` after a
    success."""

    first: float = 1.0
    cap: float = 30.0
    _next: float = 0.0

    def next(self) -> float:
        delay = min(self.cap, self._next or self.first)
        self._next = min(self.cap, delay * 2)
        return delay

    def reset(self) -> None:
        self._next = 0.0


class ObservationHealth:
    """The outage state of the planner's metrics source, with its metrics. `failed` and
    `succeeded` take the time (monotonic seconds) from the caller."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.error: str | None = None
        self.down_since: float | None = None
        self.failures = 0  # consecutive
        self.up = Gauge(
            "stator_planner_observation_up",
            "1 when the planner's last read of its metrics source succeeded, else 0",
            registry=registry,
        )
        self.failures_total = Counter(
            "stator_planner_observation_failures",
            "Reads of the metrics source (frontends or Prometheus) that failed",
            registry=registry,
        )
        self.last_success = Gauge(
            "stator_planner_last_observation_timestamp_seconds",
            "Unix time of the last successful read of the metrics source",
            registry=registry,
        )
        self.up.set(0)

    @property
    def ok(self) -> bool:
        return self.error is None

    def failed(self, now: float, error: str, retry_in: float) -> None:
        self.failures += 1
        self.failures_total.inc()
        self.up.set(0)
        if self.error is None:
            self.down_since = now
            log.warning(
                "cannot read traffic (%s); holding worker counts, retrying (every %.0fs at most)",
                error,
                retry_in,
            )
        else:
            log.debug("still cannot read traffic (%s); retry in %.1fs", error, retry_in)
        self.error = error

    def succeeded(self, now: float) -> None:
        if self.error is not None and self.down_since is not None:
            log.warning(
                "traffic readable again after %.0fs and %d failed reads",
                now - self.down_since,
                self.failures,
            )
        self.error, self.down_since, self.failures = None, None, 0
        self.up.set(1)
        self.last_success.set_to_current_time()


class StatusServer(StatusPort):
    """`/metrics` (the planner's registry), `/live` (the process answers: always 200) and
    `/health` (200 while the planner sees its traffic, 503 with the reason while not)."""

    def __init__(self, registry: CollectorRegistry, health: ObservationHealth, port: int) -> None:
        super().__init__("0.0.0.0", port)
        self.registry = registry
        self.observation = health

    def health(self) -> tuple[dict, int]:
        seen = self.observation
        if seen.ok:
            return {"status": "healthy"}, 200
        return {"status": "blind", "error": seen.error, "failures": seen.failures}, 503

    def metrics(self) -> bytes:
        return generate_latest(self.registry)
