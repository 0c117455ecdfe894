"""Serving the app: `serve_frontend` (blocks until stopped; `stator frontend` and
`stator run` use it) and `running_frontend` (an async context manager that serves on a
free port in the current event loop, for tests and embedding)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import signal
import socket
import ssl
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI

from stator.frontend.config import FrontendConfig
from stator.frontend.http.app import create_app
from stator.frontend.metrics import FrontendMetrics
from stator.frontend.pipelines.manager import ModelManager, RouteSource
from stator.router import RouterConfig
from stator.runtime import Runtime

log = logging.getLogger(__name__)


def _http_impl(config: FrontendConfig) -> Any:
    # httptools parses HTTP in C, and our subclass adds connection limits and timeouts;
    # h11 is the pure-Python fallback (without them).
    if not importlib.util.find_spec("httptools"):
        return "h11"
    from stator.frontend.http.connections import ConnectionLimits, limited_protocol, max_connections

    return limited_protocol(
        ConnectionLimits(
            header_timeout=config.header_timeout,
            body_timeout=config.body_timeout,
            max_header_bytes=config.max_header_bytes,
            max_connections=max_connections(config.max_connections),
        )
    )


_CLIENT_CERT = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def _tls_options(config: FrontendConfig) -> dict[str, Any]:
    if not config.ssl_keyfile and not config.ssl_certfile:
        return {}
    if not (config.ssl_keyfile and config.ssl_certfile):
        raise ValueError("HTTPS needs both --ssl-keyfile and --ssl-certfile")
    if config.ssl_client_cert != "none" and not config.ssl_ca_certs:
        raise ValueError("--ssl-client-cert needs --ssl-ca-certs to verify them against")
    return {
        "ssl_keyfile": config.ssl_keyfile,
        "ssl_certfile": config.ssl_certfile,
        "ssl_ca_certs": config.ssl_ca_certs,
        "ssl_cert_reqs": _CLIENT_CERT[config.ssl_client_cert],
    }


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to its host (uvicorn's own handlers
    re-raise the signal after shutdown, which would kill the process before stator's
    cleanup runs)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class RunningFrontend:
    app: FastAPI
    manager: ModelManager
    metrics: FrontendMetrics
    host: str
    port: int
    scheme: str = "http"

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


def _bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A listening socket; with `reuse_port`, one of several processes' on the same port
    (SO_REUSEPORT: the kernel spreads new connections over them)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def _uvicorn_config(app: FastAPI, config: FrontendConfig, grace: float = 5.0) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        http=_http_impl(config),
        **_tls_options(config),
        lifespan="off",  # the manager's lifetime is ours, not the app's
        access_log=config.access_log,
        log_config=None,  # keep stator's log format (with request ids)
        # Seconds in-flight responses get once a stop begins.
        timeout_graceful_shutdown=grace,
    )


def _cut_connections(server: uvicorn.Server) -> None:
    """Cancel the in-flight requests (their streams close, so the engines abort them)
    and close every connection."""
    for task in list(server.server_state.tasks):
        task.cancel()
    for connection in list(server.server_state.connections):
        transport = getattr(connection, "transport", None)
        if transport is not None:
            transport.close()


@contextlib.asynccontextmanager
async def running_frontend(
    runtime: Runtime,
    frontend_config: FrontendConfig | None = None,
    router_config: RouterConfig | None = None,
    routes: RouteSource | None = None,
    metrics: FrontendMetrics | None = None,
) -> AsyncIterator[RunningFrontend]:
    """Serve the frontend in this event loop until the block exits. `routes`: serve the
    models of a route source (the global router) instead of this namespace's."""
    config = frontend_config or FrontendConfig(http_host="127.0.0.1", http_port=0)
    metrics = metrics or FrontendMetrics()
    manager = ModelManager(
        runtime, router_config or RouterConfig(), metrics, routes, processor=config.processor
    )
    await manager.start()
    app = create_app(manager, metrics, config)
    sock = _bind(config.http_host, config.http_port)
    port = sock.getsockname()[1]
    server = _EmbeddedServer(_uvicorn_config(app, config))
    task = asyncio.create_task(server.serve(sockets=[sock]), name="frontend http")
    try:
        while not server.started:
            if task.done():
                task.result()  # startup failed: raise its error
            await asyncio.sleep(0.01)
        scheme = "https" if config.ssl_certfile else "http"
        yield RunningFrontend(app, manager, metrics, config.http_host, port, scheme)
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task
        sock.close()
        await app.state.worker_admin.close()
        await manager.close()


async def serve_frontend(
    runtime: Runtime,
    frontend_config: FrontendConfig,
    router_config: RouterConfig,
    *,
    stop: asyncio.Event | None = None,
    handle_signals: bool = True,
    reuse_port: bool = False,
    routes: RouteSource | None = None,
    metrics: FrontendMetrics | None = None,
) -> None:
    """Serve until `stop` is set or, with `handle_signals`, until SIGINT/SIGTERM; then
    let in-flight HTTP requests finish (uvicorn's graceful shutdown) and close the model
    manager. The caller owns `runtime` and shuts it down afterwards. `reuse_port`: bind
    with SO_REUSEPORT, as one of several processes serving the port
    (`stator frontend --api-server-count`). `routes`: serve the models of a route source
    (the global router) instead of this namespace's; `metrics`: a registry it shares."""
    metrics = metrics or FrontendMetrics()
    manager = ModelManager(
        runtime, router_config, metrics, routes, processor=frontend_config.processor
    )
    await manager.start()
    app = create_app(manager, metrics, frontend_config)
    sock = _bind(frontend_config.http_host, frontend_config.http_port, reuse_port)
    # In-flight responses get the runtime's grace period (--graceful-shutdown-timeout).
    grace = runtime.config.graceful_shutdown_timeout
    server = _EmbeddedServer(_uvicorn_config(app, frontend_config, grace))
    log.info(
        "frontend listening on %s://%s:%d",
        "https" if frontend_config.ssl_certfile else "http",
        frontend_config.http_host,
        sock.getsockname()[1],
    )

    def request_exit() -> None:
        server.should_exit = True

    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM) if handle_signals else ()
    for sig in signals:
        loop.add_signal_handler(sig, request_exit)
    stopper = None
    if stop is not None:

        async def wait_stop() -> None:
            await stop.wait()
            request_exit()

        stopper = asyncio.create_task(wait_stop())
    try:
        await server.serve(sockets=[sock])
    except asyncio.CancelledError:
        # Cancelled (a lifecycle whose grace ran out): cut what is still in flight
        # rather than leave its tasks running behind us.
        _cut_connections(server)
        raise
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        if stopper is not None:
            stopper.cancel()
        sock.close()
        await app.state.worker_admin.close()
        await manager.close()
