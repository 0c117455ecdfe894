"""The worker's optional status port: `/live` (the process answers), `/health` (the engine
passed its last check and the worker is registered: 200, else 503) and `/metrics`
(Prometheus text). For load balancers, Kubernetes probes and Prometheus scrapes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

if TYPE_CHECKING:
    from stator.worker.host import WorkerHost


class StatusServer:
    def __init__(self, host: WorkerHost, bind: str, port: int) -> None:
        self.host = host
        self.bind = bind
        self.port = port
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/live", self._live)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.bind, self.port)
        await site.start()
        # Port 0 asks for any free port; report the one we got.
        server = site._server
        if server is not None and server.sockets:
            self.port = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _live(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "live"})

    async def _health(self, request: web.Request) -> web.Response:
        host = self.host
        body = {
            "status": "healthy" if host.healthy else "unhealthy",
            "model": host.card.name if host.card else None,
            "endpoint": str(host.endpoint),
            "instance_id": f"{host.runtime.instance_id:x}",
        }
        if host.failure:
            body["error"] = host.failure
        return web.json_response(body, status=200 if host.healthy else 503)

    async def _metrics(self, request: web.Request) -> web.Response:
        metrics = self.host.metrics
        payload = generate_latest(metrics.registry) if metrics is not None else b""
        return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE_LATEST})
