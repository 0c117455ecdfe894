"""A frontend with in-process workers, served on a free port by an event loop in its own
thread, so that both the sync and the async `openai` clients can talk to it over HTTP.

The workers are `ScriptedEngine` test doubles served straight on the runtime with a tiny
handler (standing in for the worker host): it streams the engine's outputs and calls
`engine.abort` when the caller closes the stream before the end, as the worker host does.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import msgspec

from stator.engines.base import Engine
from stator.frontend import FrontendConfig, RunningFrontend, running_frontend
from stator.protocols import EngineRequest
from stator.runtime import Runtime, RuntimeConfig
from stator.runtime.discovery import mem as mem_discovery

STORE = "frontend-tests"
# Seconds each step of `Stack.stop` may take (uvicorn gives in-flight responses 5 s).
STOP_STEP_TIMEOUT = 20.0


def engine_handler(engine: Engine):
    async def handler(request: EngineRequest):
        finished = False
        try:
            async for output in engine.generate(request):
                if output.finish_reason is not None:
                    finished = True
                yield output
        finally:
            if not finished:
                await engine.abort(request.request_id)

    return handler


class Stack:
    def __init__(self, model_dir: Path, store: str = STORE, **frontend: Any) -> None:
        self.model_dir = model_dir
        self.frontend_fields = frontend  # FrontendConfig fields (e.g. rate limits)
        self.store_name = store
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.frontend_runtime: Runtime | None = None
        self.frontend: RunningFrontend | None = None
        self._frontend_cm: Any = None
        self.workers: list[Runtime] = []
        self._store: mem_discovery.MemStore | None = None

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def acall(self, coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout)

    # -- on the stack's loop ---------------------------------------------------------

    async def new_runtime(self) -> Runtime:
        """A runtime on the stack's discovery store. The store is put back first: the
        tests' autouse fixture empties the registry of mem stores between tests, and a
        module-wide stack outlives that."""
        if self._store is None:
            self._store = mem_discovery.MemStore()
        mem_discovery._stores[self.store_name] = self._store
        return await Runtime.create(RuntimeConfig(discovery=f"mem:{self.store_name}"))

    async def _start(self) -> None:
        self.frontend_runtime = await self.new_runtime()
        self._frontend_cm = running_frontend(
            self.frontend_runtime,
            FrontendConfig(http_host="127.0.0.1", http_port=0, **self.frontend_fields),
        )
        self.frontend = await self._frontend_cm.__aenter__()

    async def _add_worker(self, engine: Engine, endpoint: str, **card_fields: Any) -> Runtime:
        runtime = await self.new_runtime()
        engine.worker_id = runtime.instance_id
        await engine.start()
        await runtime.serve(endpoint, engine_handler(engine), EngineRequest)
        card = msgspec.structs.replace(
            engine.model_card(), source_path=str(self.model_dir), **card_fields
        )
        await runtime.publish_model_card(endpoint, card)
        self.workers.append(runtime)
        return runtime

    async def _stop(self) -> None:
        """The frontend first, so that its HTTP streams end before the workers behind
        them go away. Each step is bounded: a stuck step fails the teardown, naming it,
        instead of hanging it."""
        if self._frontend_cm is not None:
            await self._bounded(self._frontend_cm.__aexit__(None, None, None), "the frontend")
        if self.frontend_runtime is not None:
            await self._bounded(self.frontend_runtime.shutdown(), "the frontend's runtime")
        for runtime in self.workers:
            await self._bounded(runtime.shutdown(), "a worker's runtime")

    @staticmethod
    async def _bounded(step: Coroutine[Any, Any, Any], what: str) -> None:
        try:
            await asyncio.wait_for(step, STOP_STEP_TIMEOUT)
        except TimeoutError:
            raise AssertionError(f"stopping {what} took over {STOP_STEP_TIMEOUT}s") from None

    # -- from the test's thread ------------------------------------------------------

    def start(self) -> Stack:
        self.call(self._start())
        return self

    def add_worker(
        self, engine: Engine, endpoint: str, *, wait_model: str | None = None, **card: Any
    ) -> Runtime:
        runtime = self.call(self._add_worker(engine, endpoint, **card))
        if wait_model is not None:
            self.wait_for_model(wait_model)
        return runtime

    def remove_worker(self, runtime: Runtime) -> None:
        self.workers.remove(runtime)
        self.call(runtime.shutdown())

    def wait_for_model(self, name: str, timeout: float = 120.0) -> None:
        """Until the frontend serves `name`: its pipeline loads the model's tokenizer (on a
        busy machine, o200k_harmony's takes 15-30 s)."""
        assert self.frontend is not None
        self.call(self.frontend.manager.wait_for_model(name, timeout), timeout + 10)

    @property
    def base_url(self) -> str:
        assert self.frontend is not None
        return self.frontend.base_url

    def stop(self) -> None:
        try:
            self.call(self._stop(), timeout=4 * STOP_STEP_TIMEOUT)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()
