"""Run one worker process: runtime + engine + host until a stop signal or a fatal failure.

Exit codes: 0 after a graceful stop (SIGTERM/SIGINT: unregister, drain within the grace
period, stop); 1 when the engine fails to start, dies or fails its health check (the
worker unregisters at once and its in-flight streams are cut, so callers migrate them).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from stator.engines.base import Engine
from stator.runtime import Runtime, RuntimeConfig
from stator.runtime.lifecycle import EXIT_FATAL, Lifecycle
from stator.worker.config import WorkerConfig
from stator.worker.host import WorkerHost

log = logging.getLogger(__name__)


async def serve_worker(
    runtime_config: RuntimeConfig,
    worker_config: WorkerConfig,
    engine: Engine,
    model_dir: Path | None = None,
) -> int:
    runtime = await Runtime.create(runtime_config)
    host = WorkerHost(runtime, engine, worker_config, model_dir=model_dir)
    try:
        await host.start()
    except Exception as exc:
        log.error("worker failed to start: %s: %s", type(exc).__name__, exc)
        await host.stop(grace=0)
        await runtime.shutdown(grace=0)
        return EXIT_FATAL
    # The runtime's lifecycle drains on SIGTERM/SIGINT (unregister, let in-flight
    # streams finish within the grace period) and exits 1 when the engine dies.
    lifecycle = Lifecycle(runtime, grace=runtime_config.graceful_shutdown_timeout)
    host.on_fatal(lifecycle.fatal)
    lifecycle.on_stop(lambda: host.stop(grace=0))
    code = await lifecycle.run(asyncio.Event().wait())
    log.info("worker stopped (exit %d)", code)
    return code
