"""Run one worker process: runtime + engine + host until a stop signal or a fatal failure.

Exit codes: 0 after a graceful stop (SIGTERM/SIGINT: unregister, drain within the grace
period, stop); 1 when the engine fails to start, dies or fails its health check (the
worker unregisters at once and its in-flight streams are cut, so callers migrate them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from stator.engines.base import Engine
from stator.runtime import Runtime, RuntimeConfig
from stator.worker.config import WorkerConfig
from stator.worker.host import WorkerHost
from stator.worker.signals import stop_on_signals

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FATAL = 1


async def serve_worker(
    runtime_config: RuntimeConfig,
    worker_config: WorkerConfig,
    engine: Engine,
    model_dir: Path | None = None,
) -> int:
    runtime = await Runtime.create(runtime_config)
    host = WorkerHost(runtime, engine, worker_config, model_dir=model_dir)
    with stop_on_signals() as stop:
        try:
            await host.start()
        except Exception as exc:
            log.error("worker failed to start: %s: %s", type(exc).__name__, exc)
            await host.stop(grace=0)
            await runtime.shutdown(grace=0)
            return EXIT_FATAL
        fatal = asyncio.create_task(host.wait_fatal())
        stopped = asyncio.create_task(stop.stop.wait())
        await asyncio.wait({fatal, stopped}, return_when=asyncio.FIRST_COMPLETED)
        fatal.cancel()
        stopped.cancel()
        if host.failure is not None:
            await host.stop(grace=0)
            await runtime.shutdown(grace=0)
            return EXIT_FATAL
        grace = runtime_config.graceful_shutdown_timeout
        draining = asyncio.create_task(host.stop(grace=grace))
        hurry = asyncio.create_task(stop.hurry.wait())
        await asyncio.wait({draining, hurry}, return_when=asyncio.FIRST_COMPLETED)
        hurry.cancel()
        if not draining.done():
            draining.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await draining
            log.warning("stopped without waiting for in-flight requests")
        elif not draining.result():
            log.warning("in-flight requests did not finish within %.0fs", grace)
        await runtime.shutdown(grace=0)
        log.info("worker stopped")
        return EXIT_OK
