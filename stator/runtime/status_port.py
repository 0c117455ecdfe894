"""A process's small HTTP status port: `/live` (the process answers: always 200), `/health`
(200 or 503 with a JSON body saying why) and `/metrics` (Prometheus text). Workers and the
planner each serve one, for load balancers, Kubernetes probes and Prometheus scrapes; what
"healthy" means and which registry is scraped is theirs to say (`health`, `metrics`)."""

from __future__ import annotations

from abc import ABC, abstractmethod

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST


class StatusPort(ABC):
    def __init__(self, bind: str, port: int) -> None:
        self.bind = bind
        self.port = port
        self._runner: web.AppRunner | None = None

    @abstractmethod
    def health(self) -> tuple[dict, int]:
        """The `/health` body and its status code."""

    @abstractmethod
    def metrics(self) -> bytes:
        """The `/metrics` payload, in Prometheus text format."""

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
        body, status = self.health()
        return web.json_response(body, status=status)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics(), headers={"Content-Type": CONTENT_TYPE_LATEST})
