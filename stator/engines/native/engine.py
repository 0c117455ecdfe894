"""`NativeEngine`: the `Engine` the worker host serves, around the synchronous core.

One asyncio task drives the core: it runs each `step()` in a dedicated thread (the event
loop stays responsive while the model computes) and routes the step's outputs to
per-request queues. Anything else that changes the core (add, abort, clear) runs on the
event loop between two steps, so the core is never touched by two threads at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from stator.engines.base import Engine, EngineDead
from stator.engines.native.admission import admit
from stator.engines.native.config import ModelSpec, NativeConfig
from stator.engines.native.core_metrics import core_metrics
from stator.engines.native.engine_admin import LoraAndSleep
from stator.engines.native.engine_core import EngineCore
from stator.engines.native.engine_disagg import DisaggServing
from stator.engines.native.kv_handoff import ImportPlan
from stator.engines.native.models import model_class
from stator.engines.native.native_card import CoreInfo, native_card
from stator.kv.transfer.agent import KvTransferAgent
from stator.kv.transfer.stats import TransferStats
from stator.protocols import (
    DisaggParams,
    EngineOutput,
    EngineRequest,
    KvEvent,
    LoadReport,
    ModelCard,
    Usage,
)

log = logging.getLogger(__name__)
T = TypeVar("T")


class NativeEngine(LoraAndSleep, DisaggServing, Engine):
    def __init__(self, config: NativeConfig, model_path: str, served_name: str) -> None:
        self.config = config
        self.model_path = str(model_path)
        self.served_name = served_name
        # Fail fast on a directory we cannot serve (missing config, unknown architecture).
        model_class(ModelSpec.from_dir(model_path).architecture)
        self.core: EngineCore | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="native-step")
        self._streams: dict[str, asyncio.Queue[EngineOutput]] = {}
        self._deferred: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []
        self._wakeup = asyncio.Event()
        self._stepping = False
        self._dead: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._subscribers: list[asyncio.Queue[list[KvEvent]]] = []
        self._load: LoadReport | None = None
        self._step_lock = threading.Lock()
        self._sleep_level: int | None = None
        self._sleep_lock = asyncio.Lock()
        self.agent: KvTransferAgent | None = None
        self.rank_agents: list[dict] = []  # tensor parallelism: ranks 1..N-1's agents
        self.transfers = TransferStats()
        self._side_tasks: set[asyncio.Task] = set()
        # One lock per adapter name: concurrent loads of one name are serialized.
        self._lora_locks: dict[str, asyncio.Lock] = {}

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.core = await loop.run_in_executor(
            self._executor,
            lambda: EngineCore(self.config, self.model_path, worker_id=self.worker_id),
        )
        for item in self.config.lora_modules:
            name, sep, source = item.partition("=")
            if not sep or not name or not source:
                raise ValueError(f"--lora-modules entry {item!r} is not name=path")
            # Named by the operator at start: not limited to --lora-allowed-dirs.
            await self._load_lora(name.strip(), source.strip(), allowed_dirs=None)
        if self.role != "aggregated":
            await self._start_transfer(self.core)
        self._refresh_load()
        self._task = asyncio.create_task(self._run(), name="native-engine-loop")

    async def shutdown(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for rid in list(self._streams):
            self._finish_stream(rid, EngineOutput(finish_reason="abort"))
        for task in list(self._side_tasks):
            task.cancel()
        if self.agent is not None:
            await self.agent.close()
        if self.core is not None:  # after any step in flight: stops tensor-parallel ranks
            await asyncio.get_running_loop().run_in_executor(self._executor, self.core.close)
        self._executor.shutdown(wait=True)

    async def health_check(self) -> None:
        if self._dead is not None:
            raise EngineDead(self._dead)
        if self._task is None or self._task.done():
            raise EngineDead("the native engine loop is not running")

    # -- requests ------------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        core = self._core()
        request = admit(request, self._sleep_level, core.adapters, self._streams)
        rid = request.request_id
        queue: asyncio.Queue[EngineOutput] = asyncio.Queue()
        self._streams[rid] = queue
        disagg = request.disagg
        pulls = (
            self.agent is not None
            and disagg is not None
            and disagg.prefill_worker_id is not None
            and bool(disagg.transfer)
        )
        # A router's prefill request (prefill role): its KV is pinned at its end under its id.
        exports = disagg is not None and disagg.prefill_worker_id is None
        answered = False  # its final output went to the caller (with the pin's name)
        admitted: list[ImportPlan | None] = []  # set once the core has the request

        def admit_to_core() -> ImportPlan | None:
            plan = core.begin_import(request) if pulls else core.add_request(request)
            admitted.append(plan)
            return plan

        try:
            plan = await self._between_steps(admit_to_core)
        except BaseException:
            self._streams.pop(rid, None)
            if admitted:
                # Cancelled after the core took it (the step that ran the admission ended
                # as the cancel came: asyncio raised in place of the answer): nothing else
                # would ever free its blocks, or end its pull's pin.
                self._spawn(self._drop_admitted(rid, admitted[0], disagg if pulls else None))
            elif pulls:
                # Cancelled (or refused) before the core took it: no pull will ever read
                # the prefill side's pin, so unpin it now rather than at its timeout.
                assert disagg is not None
                self._spawn(self._release_remote(disagg))
            raise
        self._refresh_load()
        self._wakeup.set()
        try:
            if pulls:
                assert disagg is not None
                if plan is None:  # prefilled here instead: the prefill side may unpin
                    self.transfers.fallbacks += 1
                    self._spawn(self._release_remote(disagg))
                else:
                    # Shielded: the pull goes on (and frees its blocks) if the caller leaves.
                    await asyncio.shield(self._spawn(self._import(disagg, plan)))
            while True:
                out = await queue.get()
                answered = out.finish_reason is not None
                yield out
                if answered:
                    return
        finally:
            if rid in self._streams:  # the caller stopped reading: free the request now
                self._streams.pop(rid, None)
                # Shielded: a second cancel must not drop the abort (it would then decode
                # to max_tokens for nobody).
                await asyncio.shield(self._spawn(self.abort(rid)))
            if exports and not answered:
                # The caller left before it heard where the KV is pinned (its prefill may
                # have ended, and pinned it, as the cancel came): no decode worker will
                # ever pull it, so unpin it now rather than at its timeout.
                await asyncio.shield(self._spawn(self.release_kv(rid)))

    async def _drop_admitted(
        self, rid: str, plan: ImportPlan | None, disagg: DisaggParams | None
    ) -> None:
        """Undo an admission whose caller was cancelled before it saw the answer: abort
        the request (a pull plan's pull never started: end it as aborted) and unpin."""
        core = self._core()

        def drop() -> None:
            core.abort(rid)
            if plan is not None:  # its pull never started: end it as aborted
                core.end_import(rid, False)

        with contextlib.suppress(EngineDead):
            await self._between_steps(drop)
        self._after_change()
        if disagg is not None:
            await self._release_remote(disagg)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)
        return task

    async def abort(self, request_id: str) -> None:
        core = self.core
        if core is None:
            return
        seq = core.seqs.get(request_id)
        usage = None
        if seq is not None:  # a snapshot; the step thread may be one token ahead
            usage = Usage(
                prompt_tokens=seq.num_prompt_tokens,
                completion_tokens=seq.num_emitted,
                cached_tokens=seq.num_cached_tokens or 0,
            )
        self._finish_stream(request_id, EngineOutput(finish_reason="abort", usage=usage))
        await self._between_steps(lambda: core.abort(request_id))
        self._after_change()

    # -- state ---------------------------------------------------------------------------

    def model_card(self) -> ModelCard:
        info = CoreInfo.of(self._core())
        return native_card(self.config, self.model_path, self.served_name, info, self.list_loras())

    def load(self) -> list[LoadReport]:
        if self._load is None:
            return [LoadReport(worker_id=self.worker_id)]
        return [self._load]

    async def kv_events(self) -> AsyncIterator[list[KvEvent]]:
        queue: asyncio.Queue[list[KvEvent]] = asyncio.Queue()
        self._subscribers.append(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._subscribers.remove(queue)

    def kv_state(self) -> list[KvEvent]:
        # The step thread holds the lock while it changes the cache (at most one step).
        with self._step_lock:
            return self._core().kv_state()

    async def clear_kv(self) -> None:
        await self._between_steps(self._core().clear_kv)
        self._after_change()

    def metrics(self) -> dict[str, Any]:
        if self.core is None:
            return {}
        return {**core_metrics(self.core), **self.transfers.gauges()}

    # -- the loop ------------------------------------------------------------------------

    async def _run(self) -> None:
        core = self._core()
        loop = asyncio.get_running_loop()
        while True:
            self._run_deferred()
            self._expire(core)
            if not core.has_work():
                self._wakeup.clear()
                deadline = core.exports.next_deadline()
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), timeout)
                continue
            self._stepping = True
            try:
                outputs = await loop.run_in_executor(self._executor, self._locked_step)
            except Exception as exc:
                log.exception("native engine step failed")
                self._die(f"engine step failed: {exc!r}")
                return
            finally:
                self._stepping = False
            for rid, out in outputs:
                if out.finish_reason is not None:
                    self._finish_stream(rid, out)
                else:
                    queue = self._streams.get(rid)
                    if queue is not None:
                        queue.put_nowait(out)
            self._after_change()
            # Yield to the event loop so that consumers and new requests get a turn.
            await asyncio.sleep(0)

    def _expire(self, core: EngineCore) -> None:
        deadline = core.exports.next_deadline()
        if deadline is not None and deadline <= time.monotonic():
            expired = core.expire_exports()
            log.warning("%d pinned prompt(s) expired unpulled; KV released", expired)
            self._after_change()

    def _locked_step(self) -> list[tuple[str, EngineOutput]]:
        with self._step_lock:
            return self._core().step()

    async def _between_steps(self, fn: Callable[[], T]) -> T:
        if self._dead is not None:
            raise EngineDead(self._dead)
        if not self._stepping:
            return fn()
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._deferred.append((fn, future))
        return await future

    def _run_deferred(self) -> None:
        deferred, self._deferred = self._deferred, []
        for fn, future in deferred:
            if future.done():
                continue
            try:
                future.set_result(fn())
            except Exception as exc:
                future.set_exception(exc)
        if deferred:
            self._after_change()

    def _after_change(self) -> None:
        core = self.core
        if core is None:
            return
        self._refresh_load()
        events = core.drain_kv_events()
        if events:
            for queue in self._subscribers:
                queue.put_nowait(events)

    def _refresh_load(self) -> None:
        if self.core is not None and not self._stepping:
            self._load = self.core.load(self.worker_id)

    def _finish_stream(self, rid: str, out: EngineOutput) -> None:
        queue = self._streams.pop(rid, None)
        if queue is not None:
            queue.put_nowait(out)

    def _die(self, reason: str) -> None:
        self._dead = reason
        for rid in list(self._streams):
            self._finish_stream(rid, EngineOutput(finish_reason="error", error=reason))
        for _fn, future in self._deferred:
            if not future.done():
                future.set_exception(EngineDead(reason))
        self._deferred = []

    def _core(self) -> EngineCore:
        if self._dead is not None:
            raise EngineDead(self._dead)
        if self.core is None:
            raise RuntimeError("the engine is not started (call start() first)")
        return self.core
