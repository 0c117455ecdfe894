"""`stator run --api-server-count N`: the HTTP side in N processes, the workers in this one.

With one HTTP process, `stator run` keeps everything in one process (in-process discovery
and request plane). With N, the frontend's Python work (HTTP, detokenizing, SSE) would
otherwise share one core with the worker host: here N frontend processes serve the port
together (SO_REUSEPORT, as `stator frontend --api-server-count N` does) and find this
process's workers through `file` discovery in a private directory, over the TCP request
plane. The engine cores are processes of their own either way (`--engine-core-process`).

The supervisor part lives in this process's event loop: it starts the frontends (spawned
interpreters), waits until one of them lists the model, and on a stop signal passes
SIGTERM on, waits for them (their in-flight responses finish), then stops the workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
import urllib.request

from stator.runtime import RuntimeConfig

log = logging.getLogger(__name__)

_READY_TIMEOUT_S = 120.0


class FrontendProcesses:
    """N `stator frontend` processes on one held port, found by the workers' discovery."""

    def __init__(self, count: int, namespace: str, frontend_config, router_config) -> None:
        from stator.cli.frontend import _router_reads_load
        from stator.frontend.http.api_servers import reuse_port_socket

        self.count = count
        self.dir = tempfile.mkdtemp(prefix="stator-run-")
        self.runtime_config = RuntimeConfig(namespace=namespace, discovery=f"file:{self.dir}")
        # Held (bound, not listening) while the servers run: port 0 becomes one port for all.
        self.held = reuse_port_socket(frontend_config.http_host, frontend_config.http_port)
        port = self.held.getsockname()[1]
        self.frontend_config = dataclasses.replace(frontend_config, http_port=port)
        if not router_config.router_replica_sync and _router_reads_load(router_config):
            router_config = dataclasses.replace(router_config, router_replica_sync=True)
        self.router_config = router_config
        self.procs: list[multiprocessing.process.BaseProcess] = []

    @property
    def base_url(self) -> str:
        host = self.frontend_config.http_host
        host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        return f"http://{host}:{self.frontend_config.http_port}"

    def start(self, log_level: str) -> None:
        from stator.cli.frontend import _serve_one
        from stator.frontend.http.api_servers import _child_main
        from stator.global_router import GlobalRouterConfig

        context = multiprocessing.get_context("spawn")
        args = (log_level, self.runtime_config, self.frontend_config, self.router_config)
        for i in range(self.count):
            proc = context.Process(
                target=_child_main,
                args=(_serve_one, (*args, GlobalRouterConfig())),
                name=f"api-server-{i}",
            )
            proc.start()
            self.procs.append(proc)
        log.info("started %d API server processes: pids %s", self.count, self.pids())

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    async def wait_for_model(self, model: str) -> None:
        """Until a frontend lists `model` (the workers' cards reached it)."""
        deadline = time.monotonic() + _READY_TIMEOUT_S
        loop = asyncio.get_running_loop()
        while time.monotonic() < deadline:
            if not any(p.is_alive() for p in self.procs):
                raise RuntimeError("every API server process exited")
            listed = await loop.run_in_executor(None, self._models)
            if model in listed:
                return
            await asyncio.sleep(0.2)
        raise TimeoutError(f"the API servers did not list {model!r} in {_READY_TIMEOUT_S}s")

    def _models(self) -> list[str]:
        try:
            with urllib.request.urlopen(f"{self.base_url}/v1/models", timeout=5) as resp:
                return [m.get("id") for m in json.loads(resp.read()).get("data", [])]
        except (OSError, ValueError):
            return []

    async def wait_exit(self) -> None:
        """Until every frontend process has exited (for the lifecycle: serving ended)."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._join, None)

    def _join(self, timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        for proc in self.procs:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            proc.join(left)
        return all(p.exitcode is not None for p in self.procs)

    async def stop(self, grace: float) -> bool:
        """SIGTERM each (they drain), wait up to `grace`, then kill what is left."""
        for proc in self.procs:
            if proc.pid is not None and proc.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
        loop = asyncio.get_running_loop()
        finished = await loop.run_in_executor(None, self._join, grace)
        for proc in self.procs:
            if proc.exitcode is None:
                proc.kill()
                proc.join(5)
        return finished

    def close(self) -> None:
        self.held.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class ProcessesDrain:
    """`stator run --api-server-count N` as the lifecycle's `Drainable`: stop HTTP service
    in the frontend processes first, then the workers, within one grace period."""

    def __init__(self, frontends: FrontendProcesses, hosts, grace: float) -> None:
        self.frontends = frontends
        self.hosts = hosts
        self.grace = grace

    async def drain(self, grace: float | None = None) -> bool:
        grace = self.grace if grace is None else grace
        deadline = asyncio.get_running_loop().time() + grace
        finished = await self.frontends.stop(grace)
        for host, _ in self.hosts:
            left = max(0.0, deadline - asyncio.get_running_loop().time())
            finished = await host.stop(grace=left) and finished
        return finished

    async def shutdown(self, grace: float | None = 0.0) -> None:
        await self.frontends.stop(0.0)
        for host, runtime in self.hosts:
            with contextlib.suppress(Exception):
                await host.stop(grace=0)
            await runtime.shutdown(grace=0)
        self.frontends.close()
