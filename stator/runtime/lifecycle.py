"""Process lifecycle for serving processes (`stator worker`, `stator frontend`).

    lifecycle = Lifecycle(runtime)
    engine_monitor.on_death = lifecycle.fatal       # a dead engine: exit non-zero
    code = await lifecycle.run(serve_forever())     # until SIGTERM / SIGINT
    sys.exit(code)

SIGTERM or SIGINT: unregister from discovery (new requests go elsewhere), let in-flight
streams finish within the grace period, shut the runtime down, exit 0. A second signal
skips the rest of the grace period. `fatal(reason)`: unregister at once, cut in-flight
streams (their callers migrate them), exit 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FATAL = 1


class Drainable(Protocol):
    """What the lifecycle needs of a runtime (`stator.runtime.Runtime` is one)."""

    async def drain(self, grace: float | None = None) -> bool: ...

    async def shutdown(self, grace: float | None = 0.0) -> None: ...


class Lifecycle:
    def __init__(
        self,
        runtime: Drainable,
        grace: float | None = None,
        signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT),
    ) -> None:
        self.runtime = runtime
        self.grace = grace  # None: the runtime's graceful_shutdown_timeout
        self.signals = signals
        self._stop = asyncio.Event()
        self._hurry = asyncio.Event()
        self._fatal_reason: str | None = None
        self._on_stop: list[Callable[[], Awaitable[Any]]] = []

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def on_stop(self, callback: Callable[[], Awaitable[Any]]) -> None:
        """Run `callback` after draining and before the runtime shuts down (close an
        engine, flush metrics)."""
        self._on_stop.append(callback)

    def request_stop(self, reason: str = "stop requested") -> None:
        """Begin a graceful stop, as SIGTERM does. A second request cuts the grace short."""
        if self._stop.is_set():
            log.warning("%s again: not waiting for in-flight requests", reason)
            self._hurry.set()
            return
        log.info("%s: draining", reason)
        self._stop.set()

    def fatal(self, reason: str) -> None:
        """Something this process cannot serve without has died: unregister and exit 1."""
        if self._fatal_reason is None:
            log.error("fatal: %s", reason)
            self._fatal_reason = reason
        self._hurry.set()
        self._stop.set()

    async def run(self, main: Awaitable[Any]) -> int:
        """Run `main` (the serving coroutine) until a signal, `fatal`, or until `main`
        ends; then drain and shut down. Returns the process exit code."""
        loop = asyncio.get_running_loop()
        installed = []
        for sig in self.signals:
            try:
                loop.add_signal_handler(sig, self.request_stop, f"received {sig.name}")
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                log.debug("cannot handle %s here (not the main thread?)", sig.name)
        task = asyncio.ensure_future(main)
        stop_wait = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({task, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
            if task.done() and not self._stop.is_set():
                exc = task.exception()
                if exc is not None:
                    log.error("serving task failed", exc_info=exc)
                    self._fatal_reason = f"serving task failed: {exc!r}"
            await self._drain()
        finally:
            stop_wait.cancel()
            for sig in installed:
                loop.remove_signal_handler(sig)
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            for callback in self._on_stop:
                try:
                    await callback()
                except Exception:
                    log.exception("stop callback failed")
            await self.runtime.shutdown(0.0)
        return EXIT_FATAL if self._fatal_reason is not None else EXIT_OK

    async def _drain(self) -> None:
        if self._fatal_reason is not None:
            await self.runtime.drain(0.0)
            return
        drain = asyncio.ensure_future(self.runtime.drain(self.grace))
        hurry = asyncio.ensure_future(self._hurry.wait())
        await asyncio.wait({drain, hurry}, return_when=asyncio.FIRST_COMPLETED)
        hurry.cancel()
        if drain.done():
            if not drain.result():
                log.warning("grace period over: cutting the streams still in flight")
        else:
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drain
        if self._fatal_reason is not None:
            return
        log.info("drained; shutting down")


def run_main(main: Callable[[], Awaitable[int]]) -> int:
    """Run an async `main` on uvloop where installed (asyncio otherwise); return its exit
    code (for `sys.exit`)."""
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main())
