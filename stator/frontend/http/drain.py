"""`FrontendDrain`: the frontend process as the runtime lifecycle's `Drainable`.

`stator frontend` runs under `stator.runtime.Lifecycle` like a worker does: on SIGTERM or
SIGINT the lifecycle drains, then shuts the runtime down and the process exits 0. For a
frontend, draining means stopping HTTP service gracefully (uvicorn stops accepting
connections and lets in-flight responses, streams included, finish) and then draining
the runtime (which serves no endpoints of its own, so that part is quick).
"""

from __future__ import annotations

import asyncio
import time

from stator.runtime import Runtime
from stator.runtime.tasks import cancel_and_wait


class FrontendDrain:
    """`stop` is the event `serve_frontend` watches; `serving` is its task."""

    def __init__(self, runtime: Runtime, stop: asyncio.Event, serving: asyncio.Future) -> None:
        self.runtime = runtime
        self.stop = stop
        self.serving = serving

    async def drain(self, grace: float | None = None) -> bool:
        """Stop HTTP service and wait for it within `grace` seconds (default: the
        runtime's graceful_shutdown_timeout). True if everything finished in time."""
        if grace is None:
            grace = self.runtime.config.graceful_shutdown_timeout
        began = time.monotonic()
        self.stop.set()
        finished = True
        if not self.serving.done():
            # shield: running out of grace leaves the serving task to the lifecycle,
            # which cancels it (cutting the streams still open).
            done, _ = await asyncio.wait({asyncio.shield(self.serving)}, timeout=grace)
            finished = bool(done)
        left = max(0.0, grace - (time.monotonic() - began))
        return await self.runtime.drain(left) and finished

    async def shutdown(self, grace: float | None = 0.0) -> None:
        if not self.serving.done():
            await cancel_and_wait([self.serving])
        await self.runtime.shutdown(grace)
