"""`NativeEngine`: the `Engine` the worker host serves, around the synchronous core.

One asyncio task drives the core: it runs each `step()` in a dedicated thread (the event
loop stays responsive while the model computes) and routes the step's outputs to
per-request queues. Anything else that changes the core (add, abort, clear) runs on the
event loop between two steps, so the core is never touched by two threads at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from stator.engines.base import Engine, EngineDead, EngineError, Unsupported
from stator.engines.native.config import ModelSpec, NativeConfig
from stator.engines.native.engine_core import EngineCore
from stator.engines.native.kv_handoff import ImportPlan
from stator.engines.native.lora.adapter import load_adapter, pin_adapter
from stator.engines.native.lora.resolve import resolve_adapter
from stator.engines.native.models import model_class
from stator.kv.transfer.agent import KvTransferAgent
from stator.kv.transfer.stats import TransferStats
from stator.protocols import (
    DisaggParams,
    EngineOutput,
    EngineRequest,
    KvEvent,
    LoadReport,
    LoraInfo,
    ModelCard,
    Usage,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)


class NativeEngine(Engine):
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

    async def _start_transfer(self, core: EngineCore) -> None:
        pool = getattr(core.runner, "kv_pool", None)
        if pool is None or self.config.tensor_parallel_size > 1:
            raise EngineError(
                f"--role {self.role} needs the KV cache in one pool (tensor-parallel size 1)"
            )
        core.exports.timeout = self.kv_transfer.timeout
        self.agent = KvTransferAgent(
            self.kv_transfer, pool, pins=core.pinned, release=self.release_kv
        )
        if self.role == "prefill":
            await self.agent.serve()
            core.transfer_info = self.agent.describe()

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
        if self._sleep_level is not None:
            raise EngineError(
                f"the engine is asleep (sleep level {self._sleep_level}): wake it up first"
            )
        if not request.lora_name and request.model in core.adapters:
            # A request to an adapter's own model card names the adapter as its model.
            request = msgspec.structs.replace(request, lora_name=request.model)
        rid = request.request_id
        if rid in self._streams:
            raise EngineError(f"request id {rid!r} is already running")
        queue: asyncio.Queue[EngineOutput] = asyncio.Queue()
        self._streams[rid] = queue
        disagg = request.disagg
        pulls = (
            self.agent is not None
            and disagg is not None
            and disagg.prefill_worker_id is not None
            and bool(disagg.transfer)
        )
        try:
            if pulls:
                plan = await self._between_steps(lambda: core.begin_import(request))
            else:
                plan = None
                await self._between_steps(lambda: core.add_request(request))
        except BaseException:
            self._streams.pop(rid, None)
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
                yield out
                if out.finish_reason is not None:
                    return
        finally:
            if rid in self._streams:  # the caller stopped reading: free the request now
                self._streams.pop(rid, None)
                await self.abort(rid)

    # -- disaggregated serving -----------------------------------------------------------

    async def _import(self, disagg: DisaggParams, plan: ImportPlan) -> None:
        """Pull the plan's blocks from the prefill worker, then schedule the request (with
        its prompt computed, or to compute it here if the pull failed), then unpin."""
        assert self.agent is not None and disagg.prefill_request_id is not None
        core = self._core()
        ok = False
        try:
            if plan.remote:
                result = await self.agent.pull(
                    disagg.transfer, disagg.prefill_request_id, plan.remote, plan.local
                )
                self.transfers.record(result)
                log.debug(
                    "request %s: pulled %d blocks (%d cached here) by %s in %.2f ms",
                    plan.request_id,
                    result.blocks,
                    plan.num_cached_blocks,
                    result.kind,
                    result.seconds * 1e3,
                )
            ok = True
        except Exception as exc:
            self.transfers.fallbacks += 1
            log.warning(
                "request %s: KV pull failed (%s); computing the prompt here", plan.request_id, exc
            )
        finally:
            rid = plan.request_id
            with contextlib.suppress(EngineDead):
                await self._between_steps(lambda: core.end_import(rid, ok))
            self._after_change()
            self._wakeup.set()
            self._spawn(self._release_remote(disagg))

    async def _release_remote(self, disagg: DisaggParams) -> None:
        if self.agent is not None and disagg.prefill_request_id is not None:
            await self.agent.release(disagg.transfer, disagg.prefill_request_id)

    async def release_kv(self, prefill_request_id: str) -> bool:
        core = self.core
        if core is None or self._dead is not None:
            return False
        released = await self._between_steps(lambda: core.release_export(prefill_request_id))
        self._after_change()
        return released

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
        core = self._core()
        return ModelCard(
            name=self.served_name,
            source_path=self.model_path,
            tokenizer_files=[
                str(Path(self.model_path) / name)
                for name in TOKENIZER_FILES
                if (Path(self.model_path) / name).is_file()
            ],
            chat_template=read_chat_template(self.model_path),
            # What one sequence can really hold: a prompt past the KV cache's capacity is
            # refused by the frontend's context check (400), never by the engine.
            context_length=core.max_total_tokens,
            kv_block_size=self.config.block_size,
            total_kv_blocks=core.blocks.num_blocks,
            max_num_seqs=self.config.max_num_seqs,
            max_num_batched_tokens=self.config.max_num_batched_tokens,
            eos_token_ids=list(core.spec.eos_token_ids),
            prompt_embeds_hidden_size=(
                core.spec.hidden_size if self.config.enable_prompt_embeds else 0
            ),
            loras=self.list_loras(),
            engine="native",
        )

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

    # -- LoRA ----------------------------------------------------------------------------

    async def load_lora(self, name: str, path: str) -> LoraInfo:
        allowed = list(self.config.lora_allowed_dirs)
        return await self._load_lora(name, path, allowed_dirs=allowed)

    async def _load_lora(
        self, name: str, source: str, *, allowed_dirs: list[str] | None
    ) -> LoraInfo:
        core = self._core()
        if not self.config.enable_lora:
            raise Unsupported("LoRA is off: start the worker with --enable-lora")
        if name == self.served_name:
            raise EngineError(f"a LoRA adapter cannot take the base model's name {name!r}")
        lock = self._lora_locks.setdefault(name, asyncio.Lock())
        async with lock:
            loop = asyncio.get_running_loop()
            # Reading and mapping the files happens off the event loop and off the step
            # thread; the adapter is registered (between two steps) only once it is whole.
            path = await loop.run_in_executor(
                None, lambda: resolve_adapter(source, allowed_dirs=allowed_dirs)
            )
            current = core.adapters.get(name)
            if current is not None and current.path == str(path):
                return self._lora_info(name)
            runner = core.runner
            adapter = await loop.run_in_executor(
                None,
                lambda: load_adapter(
                    name, path, runner.model, self.config.max_lora_rank, runner.dtype
                ),
            )
            if runner.device.type == "cuda":
                pin_adapter(adapter)
            await self._between_steps(lambda: core.add_adapter(adapter))
            log.info("LoRA adapter %s loaded from %s (rank %d)", name, path, adapter.rank)
            return self._lora_info(name)

    async def unload_lora(self, name: str) -> None:
        core = self._core()
        if not self.config.enable_lora:
            raise Unsupported("LoRA is off: start the worker with --enable-lora")
        async with self._lora_locks.setdefault(name, asyncio.Lock()):
            if not await self._between_steps(lambda: core.remove_adapter(name)):
                raise EngineError(f"LoRA adapter {name!r} is not loaded")
        log.info("LoRA adapter %s unloaded", name)

    def list_loras(self) -> list[LoraInfo]:
        core = self.core
        if core is None:
            return []
        return [self._lora_info(name) for name in sorted(core.adapters)]

    def _lora_info(self, name: str) -> LoraInfo:
        adapter = self._core().adapters[name]
        return LoraInfo(name=name, path=adapter.path, base_model=self.served_name)

    # -- sleep mode ------------------------------------------------------------------------

    def _check_sleep(self) -> None:
        if not self.config.enable_sleep_mode:
            raise Unsupported("sleep mode is off: start the worker with --enable-sleep-mode")
        if self.config.tensor_parallel_size > 1:
            raise Unsupported("sleep mode does not work with tensor parallelism yet")
        if self.config.cpu_offload_gb > 0 or self.config.disk_offload_dir:
            # The offload tiers hold the KV pool that sleep frees and wake allocates anew.
            raise Unsupported("sleep mode does not work with KV offload tiers yet")

    async def sleep(self, level: int = 1) -> None:
        """Level 1: weights to host memory, KV cache dropped; level 2: both dropped.
        Requests still running end with an error; new ones are refused until `wake`."""
        self._check_sleep()
        if level not in (1, 2):
            raise EngineError(f"sleep level must be 1 or 2, got {level}")
        core = self._core()
        async with self._sleep_lock:
            if self._sleep_level is not None:
                return
            self._sleep_level = level
            began = time.monotonic()
            for rid in list(self._streams):
                self._finish_stream(
                    rid, EngineOutput(finish_reason="error", error="the engine was put to sleep")
                )
            loop = asyncio.get_running_loop()
            try:
                # In the step thread: after any step in flight, before any next one.
                await loop.run_in_executor(self._executor, lambda: self._locked(core.sleep, level))
            except BaseException:
                self._sleep_level = None
                raise
            self._after_change()
            log.info("asleep at level %d after %.2fs", level, time.monotonic() - began)

    async def wake(self, tags: list[str] | None = None) -> None:
        self._check_sleep()
        core = self._core()
        async with self._sleep_lock:
            if self._sleep_level is None:
                return
            began = time.monotonic()
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, lambda: self._locked(core.wake, tags))
            if not core.asleep:
                self._sleep_level = None
                self._wakeup.set()
            log.info("woke %s after %.2fs", tags or "everything", time.monotonic() - began)

    def is_sleeping(self) -> bool:
        return self._sleep_level is not None

    def _locked(self, fn: Callable[..., T], *args: Any) -> T:
        with self._step_lock:
            return fn(*args)

    def metrics(self) -> dict[str, Any]:
        core = self.core
        if core is None:
            return {}
        out: dict[str, Any] = {
            "native_kv_blocks_used": core.blocks.num_used_blocks,
            "native_kv_blocks_total": core.blocks.num_blocks,
            "kv_exports_pinned": len(core.exports),
            "kv_exports_released_total": core.exports.num_released,
            "kv_exports_expired_total": core.exports.num_expired,
            "kv_imports_in_flight": len(core.importing),
            **self.transfers.gauges(),
            "preemptions_total": core.scheduler.num_preemptions,
        }
        if core.offload is not None:
            out.update(core.offload.metrics())
        return out

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


def read_chat_template(model_dir: str | Path) -> str | None:
    model_dir = Path(model_dir)
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    config = model_dir / "tokenizer_config.json"
    if not config.is_file():
        return None
    template = json.loads(config.read_text()).get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        named = {t.get("name"): t.get("template") for t in template}
        return named.get("default") or next(iter(named.values()), None)
    return template
