"""The worker's optional status port: `/live` (the process answers), `/health` (the engine
passed its last check and the worker is registered: 200, else 503) and `/metrics`
(Prometheus text). For load balancers, Kubernetes probes and Prometheus scrapes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prometheus_client import generate_latest

from stator.runtime.status_port import StatusPort

if TYPE_CHECKING:
    from stator.worker.host import WorkerHost


class StatusServer(StatusPort):
    def __init__(self, host: WorkerHost, bind: str, port: int) -> None:
        super().__init__(bind, port)
        self.host = host

    def health(self) -> tuple[dict, int]:
        host = self.host
        body = {
            "status": "healthy" if host.healthy else "unhealthy",
            "model": host.card.name if host.card else None,
            "endpoint": str(host.endpoint),
            "instance_id": f"{host.runtime.instance_id:x}",
        }
        if host.failure:
            body["error"] = host.failure
        return body, 200 if host.healthy else 503

    def metrics(self) -> bytes:
        metrics = self.host.metrics
        return generate_latest(metrics.registry) if metrics is not None else b""
