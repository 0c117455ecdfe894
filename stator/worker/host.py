"""`WorkerHost`: puts any `Engine` on the fleet.

It serves the engine's `generate` and an admin endpoint on the request plane, publishes the
model card in discovery, forwards KV events and load reports to the event plane, health-
checks the engine, and serves an optional status port. It owns no process concerns: a
fatal failure is *reported* (`failure`, `on_fatal` callbacks, `wait_fatal`), and whoever
runs the process decides how to exit (see `stator.worker.main`).

    host = WorkerHost(runtime, engine, WorkerConfig(...))
    await host.start()
    ...
    await host.stop(grace=30)      # unregister, let streams finish, stop the engine
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import msgspec

from stator.engines.base import Engine, EngineDead, EngineError
from stator.kv.transfer import TransferConfig
from stator.logs import request_id_var
from stator.protocols import (
    INVALID_REQUEST,
    AdminRequest,
    AdminResponse,
    EngineOutput,
    EngineRequest,
    KvEventBatch,
    ModelCard,
    StopConditions,
)
from stator.runtime import EngineShutdown, Runtime
from stator.runtime.names import EndpointName
from stator.runtime.tasks import cancel_and_wait
from stator.worker.admin import AdminOps
from stator.worker.card import build_card
from stator.worker.config import WorkerConfig
from stator.worker.metrics import WorkerMetrics
from stator.worker.status_server import StatusServer

log = logging.getLogger(__name__)

KV_EVENTS_TOPIC = "kv_events"
LOAD_TOPIC = "load"
# The health probe's prompt: one token id every vocabulary has.
HEALTH_PROMPT = [1]


class WorkerHost:
    def __init__(
        self,
        runtime: Runtime,
        engine: Engine,
        config: WorkerConfig,
        *,
        model_dir: str | Path | None = None,
    ) -> None:
        """`model_dir`: the resolved local model directory (its tokenizer and template
        files go into the card); default: the engine card's `source_path`."""
        self.runtime = runtime
        self.engine = engine
        self.config = config
        self.model_dir = Path(model_dir) if model_dir else None
        self.endpoint: EndpointName = config.endpoint_name(runtime.namespace)
        self.admin_endpoint = self.endpoint.sibling("admin")
        self.card: ModelCard | None = None
        self.metrics: WorkerMetrics | None = None
        self.status: StatusServer | None = None
        self.failure: str | None = None
        self.healthy = False
        self._fatal_event = asyncio.Event()
        self._on_fatal: list[Callable[[str], object]] = []
        self._card_key: str | None = None
        self._lora_card_keys: dict[str, str] = {}
        self._tasks: list[asyncio.Task] = []
        self._admin = AdminOps(
            engine,
            on_loras_changed=self._republish_card,
            before_sleep=self._leave_for_sleep,
            after_wake=self._return_after_wake,
        )
        self.sleeping = False
        self._started = False

    # -- start and stop ----------------------------------------------------------------

    async def start(self) -> None:
        self.engine.worker_id = self.runtime.instance_id
        if self.config.role != "aggregated" or self.engine.role == "aggregated":
            self.engine.role = self.config.role  # type: ignore[assignment]
        self.engine.kv_transfer = TransferConfig(
            kind=self.config.kv_transfer,
            copy=self.config.kv_transfer_copy,
            host=self.config.kv_transfer_host or self.runtime.config.host,
            timeout=self.config.kv_transfer_timeout,
            coalesce=self.config.kv_transfer_coalesce,
        )
        began = time.monotonic()
        await self.engine.start()
        load_seconds = time.monotonic() - began
        engine_card = self.engine.model_card()
        model_dir = self.model_dir
        if model_dir is None and engine_card.source_path:
            model_dir = Path(engine_card.source_path)
        served = self.config.served_model_name or engine_card.name
        self.card = build_card(engine_card, self.config, served, model_dir)
        self.metrics = WorkerMetrics(self.card.name, self.engine.load, self.engine.metrics)
        self.metrics.model_load_seconds.set(load_seconds)

        await self.runtime.serve(self.endpoint, self._generate, EngineRequest)
        await self.runtime.serve(self.admin_endpoint, self._admin_handler, AdminRequest)
        self._card_key = await self.runtime.publish_model_card(self.endpoint, self.card)
        if self.engine.list_loras():  # adapters loaded at start get their own cards too
            await self._republish_card()
        self.healthy = True
        self._started = True
        self._spawn(self._forward_kv_events(), "kv events")
        if self.config.load_report_interval > 0:
            self._spawn(self._report_load(), "load reports")
        if self.config.health_check_interval > 0:
            self._spawn(self._health_loop(), "health check")
        if self.config.system_port is not None:
            self.status = StatusServer(self, self.runtime.config.host, self.config.system_port)
            await self.status.start()
        log.info(
            "serving model %r at %s (instance %x, role %s), engine started in %.1fs",
            self.card.name,
            self.endpoint,
            self.runtime.instance_id,
            self.card.role,
            load_seconds,
        )

    async def stop(self, grace: float | None = None) -> bool:
        """Unregister (card and endpoints), let in-flight streams finish within `grace`
        seconds (default: the runtime's), then stop background tasks and the engine.
        True if every stream finished in time."""
        drained = await self.runtime.drain(grace)
        self._card_key = None
        self.healthy = False
        await cancel_and_wait(self._tasks)
        self._tasks.clear()
        if self.status is not None:
            await self.status.stop()
            self.status = None
        if self._started:
            self._started = False
            try:
                await self.engine.shutdown()
            except Exception:
                log.exception("engine shutdown failed")
        return drained

    # -- fatal failures ----------------------------------------------------------------

    def on_fatal(self, callback: Callable[[str], object]) -> None:
        """Call `callback(reason)` once if the engine dies or fails its health check."""
        self._on_fatal.append(callback)

    async def wait_fatal(self) -> str:
        await self._fatal_event.wait()
        return self.failure or "unknown failure"

    def fatal(self, reason: str) -> None:
        """The engine is gone: stop taking requests at once and tell the owner."""
        if self.failure is not None:
            return
        log.error("worker failed: %s", reason)
        self.failure = reason
        self.healthy = False
        self._spawn(self._unregister(), "unregister")
        self._fatal_event.set()
        for callback in self._on_fatal:
            try:
                callback(reason)
            except Exception:
                log.exception("fatal callback failed")

    async def _unregister(self) -> None:
        await self.runtime.unserve(self.endpoint)
        await self.runtime.unserve(self.admin_endpoint)
        for key in [self._card_key, *self._lora_card_keys.values()]:
            if key is not None:
                await self.runtime.remove_model_card(key)
        self._card_key = None
        self._lora_card_keys = {}

    # -- endpoints ---------------------------------------------------------------------

    async def _generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        token = request_id_var.set(request.request_id)
        metrics = self.metrics
        assert metrics is not None
        metrics.requests.inc()
        metrics.inflight.inc()
        finished = False
        stream = self.engine.generate(request)
        try:
            try:
                async for output in stream:
                    finished = output.finish_reason is not None
                    yield output
                    if finished:
                        return
            except EngineDead as exc:
                finished = True
                metrics.errors.inc()
                self.fatal(f"engine died: {exc}")
                # Migratable: the request was fine, this worker is not.
                raise EngineShutdown(f"engine died while serving the request: {exc}") from exc
            except EngineError as exc:
                # The engine refused the request (bad input for it): the client's to fix.
                finished = True
                metrics.errors.inc()
                log.info("engine refused the request: %s", exc)
                yield EngineOutput(
                    finish_reason="error", error=str(exc), error_code=INVALID_REQUEST
                )
                return
            except Exception as exc:
                finished = True
                metrics.errors.inc()
                log.warning("engine failed the request: %s: %s", type(exc).__name__, exc)
                yield EngineOutput(finish_reason="error", error=f"{type(exc).__name__}: {exc}")
                return
            finished = True  # the engine ended the stream without a finish reason
        finally:
            metrics.inflight.dec()
            if not finished:
                # The caller went away (closed the stream or was cancelled): free the
                # request's KV at once rather than when the engine notices.
                metrics.aborts.inc()
                try:
                    await self.engine.abort(request.request_id)
                except Exception:
                    log.exception("engine abort failed")
            with contextlib.suppress(Exception):
                await stream.aclose()
            # A generator finalized from another context cannot reset; nothing leaks then.
            with contextlib.suppress(ValueError):
                request_id_var.reset(token)

    async def _admin_handler(self, request: AdminRequest) -> AsyncIterator[AdminResponse]:
        yield await self._admin.handle(request)

    async def _republish_card(self) -> None:
        """After a LoRA change: the base card lists the adapters, and each adapter gets
        its own card (served under its name, `base_model` set) so frontends offer it."""
        if self.card is None or self._card_key is None:
            return
        loras = self.engine.list_loras()
        self.card = msgspec.structs.replace(self.card, loras=loras)
        if self.sleeping:
            return  # published on waking
        self._card_key = await self.runtime.publish_model_card(self.endpoint, self.card)
        wanted = {}
        for lora in loras:
            lora_card = msgspec.structs.replace(
                self.card, name=lora.name, base_model=self.card.name, loras=[]
            )
            key = await self.runtime.publish_model_card(
                self.endpoint, lora_card, suffix=f"lora-{lora.name}"
            )
            wanted[lora.name] = key
        for name, key in self._lora_card_keys.items():
            if name not in wanted:
                await self.runtime.remove_model_card(key)
        self._lora_card_keys = wanted

    async def _leave_for_sleep(self) -> None:
        """Out of discovery (generate endpoint and cards) before the engine sleeps, so no
        router sends it a request; the admin endpoint stays, to wake it."""
        if self.sleeping or self.card is None:
            return
        self.sleeping = True
        await self.runtime.unserve(self.endpoint)
        for key in [self._card_key, *self._lora_card_keys.values()]:
            if key is not None:
                await self.runtime.remove_model_card(key)
        self._lora_card_keys = {}
        log.info("left discovery to sleep")

    async def _return_after_wake(self) -> None:
        if not self.sleeping or self.card is None or self.failure is not None:
            return
        await self.runtime.serve(self.endpoint, self._generate, EngineRequest)
        self.sleeping = False
        self._card_key = await self.runtime.publish_model_card(self.endpoint, self.card)
        if self.engine.list_loras():
            await self._republish_card()
        log.info("awake: back in discovery")

    # -- background loops --------------------------------------------------------------

    def _spawn(self, coro, name: str) -> None:
        task = asyncio.create_task(coro, name=f"worker {name}")
        self._tasks.append(task)
        task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)

    async def _forward_kv_events(self) -> None:
        try:
            async for batch in self.engine.kv_events():
                if batch:
                    await self.runtime.publish(KV_EVENTS_TOPIC, KvEventBatch(events=list(batch)))
        except EngineDead as exc:
            self.fatal(f"engine died: {exc}")
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("KV event stream failed; routers fall back to resync via kv_state")

    async def _report_load(self) -> None:
        while True:
            try:
                for report in self.engine.load():
                    await self.runtime.publish(LOAD_TOPIC, report)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("load report failed")
            await asyncio.sleep(self.config.load_report_interval)

    async def _health_loop(self) -> None:
        while self.failure is None:
            await asyncio.sleep(self.config.health_check_interval)
            if self.sleeping:
                continue  # a sleeping engine answers no probe, by design
            problem = await self.check_health()
            if problem is not None:
                self.fatal(f"health check failed: {problem}")

    async def check_health(self) -> str | None:
        """Run the engine's own check and a one-token generate, within the timeout.
        Returns what went wrong, or None when healthy."""
        probe = asyncio.create_task(self._probe(), name="worker health probe")
        # Not wait_for: a hung engine may also hang the probe's cleanup, and the verdict
        # must not wait for that.
        done, _ = await asyncio.wait({probe}, timeout=self.config.health_check_timeout)
        if not done:
            probe.cancel()
            return f"no answer within {self.config.health_check_timeout}s"
        exc = probe.exception()
        if exc is not None:
            return f"{type(exc).__name__}: {exc}"
        return None

    async def _probe(self) -> None:
        assert self.card is not None
        await self.engine.health_check()
        request = EngineRequest(
            request_id=f"health-{uuid.uuid4().hex[:12]}",
            model=self.card.name,
            token_ids=HEALTH_PROMPT,
            stop=StopConditions(max_tokens=1, ignore_eos=True),
        )
        finished = False
        stream = self.engine.generate(request)
        try:
            async for output in stream:
                if output.finish_reason == "error":
                    raise RuntimeError(output.error or "the engine reported an error")
                if output.finish_reason is not None:
                    finished = True
                    break
        finally:
            if not finished:
                with contextlib.suppress(Exception):
                    await self.engine.abort(request.request_id)
            await stream.aclose()
        if not finished:
            raise RuntimeError("the engine ended the probe without a finish reason")
