"""`CoreProcessEngine`: the native engine with its core in a process of its own.

The worker host serves this `Engine`; the `EngineCore` runs in `core_process.py`, a child
started here, so the core's loop never waits on the host's asyncio, HTTP or per-request
Python. Inputs (adds, aborts) made in one event-loop turn go out as one frame; each step
comes back as one frame, which `_dispatch` spreads over the requests' streams
(`core_stream.RequestStream`). The process and its sockets: `core_launch.CoreProcess`.

When the core process dies (a crash, a failed step, a kill), every request in flight ends
with `EngineDead`, and `health_check` fails: the host unregisters and its owner exits,
instead of streams that hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from stator.engines.base import Engine, EngineDead, EngineError, Unsupported
from stator.engines.native.admission import admit
from stator.engines.native.config import ModelSpec, NativeConfig
from stator.engines.native.core_launch import CoreProcess
from stator.engines.native.core_messages import (
    ENCODER,
    OUTPUT_DECODER,
    AbortRequest,
    AddRequest,
    Call,
    CallResult,
    CoreFailed,
    CoreInput,
    CoreInputs,
    Shutdown,
    StepOutputs,
)
from stator.engines.native.core_stream import RequestStream
from stator.engines.native.engine_admin import check_lora_name, check_sleep_allowed
from stator.engines.native.models import model_class
from stator.engines.native.native_card import CoreInfo, native_card
from stator.protocols import (
    EngineOutput,
    EngineRequest,
    KvEvent,
    LoadReport,
    LoraInfo,
    ModelCard,
    Usage,
)

log = logging.getLogger(__name__)


class CoreProcessEngine(Engine):
    def __init__(self, config: NativeConfig, model_path: str, served_name: str) -> None:
        self.config = config
        self.model_path = str(model_path)
        self.served_name = served_name
        # Fail fast on a directory we cannot serve (missing config, unknown architecture).
        model_class(ModelSpec.from_dir(model_path).architecture)
        self.info: CoreInfo | None = None
        self._core = CoreProcess()
        self._streams: dict[str, RequestStream] = {}
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count()
        self._outbox: list[CoreInput] = []
        self._dead: str | None = None
        self._load: LoadReport | None = None
        self._metrics: dict[str, Any] = {}
        self._subscribers: list[asyncio.Queue[list[KvEvent]]] = []
        self._loras: dict[str, str] = {}
        self._lora_locks: dict[str, asyncio.Lock] = {}
        self._sleep_level: int | None = None
        self._reader: asyncio.Task[None] | None = None

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        """The core's process (None before `start`)."""
        return self._core.proc

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        if self.role != "aggregated":
            raise EngineError(
                f"--role {self.role}: the KV transfer agent runs next to the core; start the "
                "worker with --engine-core-process off"
            )
        args = {
            "config": msgspec.to_builtins(self.config),
            "model_dir": self.model_path,
            "worker_id": self.worker_id,
            "log_level": logging.getLevelName(logging.getLogger().getEffectiveLevel()),
        }
        ready = await self._core.start(args, on_exit=self._on_core_gone)
        self.info = ready.info
        self._loras = dict(ready.loras)
        self._reader = asyncio.create_task(self._read(), name="native-core-reader")

    def _on_core_gone(self) -> None:
        self._die(f"the engine core process exited ({self._core.exit_status()})")

    async def shutdown(self) -> None:
        asked = self._core.running() and self._dead is None
        if asked:
            self._outbox.append(Shutdown())
            self._flush()
        for rid in list(self._streams):
            self._finish(rid, EngineOutput(finish_reason="abort"))
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
            self._reader = None
        await self._core.close(wait_for_exit=asked)

    async def health_check(self) -> None:
        if self._dead is not None:
            raise EngineDead(self._dead)
        if not self._core.running():
            raise EngineDead("the engine core process is not running")

    # -- requests ------------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        self._alive()
        request = admit(request, self._sleep_level, self._loras, self._streams)
        rid = request.request_id
        stream = RequestStream(len(request.token_ids))
        self._streams[rid] = stream
        self._send(AddRequest(request))
        try:
            while True:
                out = await stream.take()
                yield out
                if out.finish_reason is not None:
                    return
        finally:
            if self._streams.get(rid) is stream:  # the caller stopped reading
                del self._streams[rid]
                if self._dead is None:
                    self._send(AbortRequest(rid))

    async def abort(self, request_id: str) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            usage = Usage(
                prompt_tokens=stream.prompt_tokens,
                completion_tokens=stream.emitted,
                cached_tokens=stream.cached,
            )
            self._finish(request_id, EngineOutput(finish_reason="abort", usage=usage))
        if self._dead is None and self._core.running():
            self._send(AbortRequest(request_id))

    def _send(self, item: CoreInput) -> None:
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append(item)

    def _flush(self) -> None:
        items, self._outbox = self._outbox, []
        if items and self._dead is None:
            self._core.send(ENCODER.encode(CoreInputs(items=items)))

    async def _read(self) -> None:
        while True:
            self._dispatch(OUTPUT_DECODER.decode(await self._core.recv()))

    def _dispatch(self, message: Any) -> None:
        if isinstance(message, StepOutputs):
            streams = self._streams
            for rid, out in message.outputs:
                stream = streams.get(rid)
                if stream is None:
                    continue  # aborted here while the core stepped
                if out.cached_tokens is not None:
                    stream.cached = out.cached_tokens
                stream.emitted += len(out.token_ids)
                if out.finish_reason is not None:
                    del streams[rid]
                stream.put(out)
            if message.load is not None:
                self._load = msgspec.structs.replace(message.load, worker_id=self.worker_id)
            if message.metrics is not None:
                self._metrics = message.metrics
            if message.kv_events:
                for queue in self._subscribers:
                    queue.put_nowait(message.kv_events)
        elif isinstance(message, CallResult):
            future = self._calls.pop(message.call_id, None)
            if future is None or future.done():
                return
            if message.error_kind is None:
                future.set_result(message.value)
            elif message.error_kind == "unsupported":
                future.set_exception(Unsupported(message.error or ""))
            elif message.error_kind == "engine":
                future.set_exception(EngineError(message.error or ""))
            else:
                future.set_exception(RuntimeError(message.error or "the call failed"))
        elif isinstance(message, CoreFailed):
            self._die(message.reason)

    def _finish(self, rid: str, out: EngineOutput | BaseException) -> None:
        stream = self._streams.pop(rid, None)
        if stream is not None:
            stream.put(out)

    def _die(self, reason: str) -> None:
        if self._dead is not None:
            return
        log.error("engine core died: %s", reason)
        self._dead = reason
        for rid in list(self._streams):
            self._finish(rid, EngineDead(reason))
        for future in self._calls.values():
            if not future.done():
                future.set_exception(EngineDead(reason))
        self._calls.clear()

    def _alive(self) -> None:
        if self._dead is not None:
            raise EngineDead(self._dead)
        if self.info is None:
            raise RuntimeError("the engine is not started (call start() first)")

    async def _call(self, method: str, *args: Any) -> Any:
        self._alive()
        call_id = next(self._call_ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        self._send(Call(call_id, method, list(args)))
        return await future

    # -- state ---------------------------------------------------------------------------

    def model_card(self) -> ModelCard:
        self._alive()
        assert self.info is not None
        return native_card(
            self.config, self.model_path, self.served_name, self.info, self.list_loras()
        )

    def load(self) -> list[LoadReport]:
        return [self._load or LoadReport(worker_id=self.worker_id)]

    async def kv_events(self) -> AsyncIterator[list[KvEvent]]:
        queue: asyncio.Queue[list[KvEvent]] = asyncio.Queue()
        self._subscribers.append(queue)
        try:
            while True:
                yield await queue.get()
        finally:
            self._subscribers.remove(queue)

    async def kv_state(self) -> list[KvEvent]:  # type: ignore[override]
        return msgspec.convert(await self._call("kv_state"), list[KvEvent])

    async def clear_kv(self) -> None:
        await self._call("clear_kv")

    def metrics(self) -> dict[str, Any]:
        return dict(self._metrics)

    # -- LoRA and sleep ------------------------------------------------------------------

    async def load_lora(self, name: str, path: str) -> LoraInfo:
        check_lora_name(self.config, name, self.served_name)
        async with self._lora_locks.setdefault(name, asyncio.Lock()):
            allowed = list(self.config.lora_allowed_dirs)
            self._loras[name] = await self._call("load_lora", name, path, allowed)
        return LoraInfo(name=name, path=self._loras[name], base_model=self.served_name)

    async def unload_lora(self, name: str) -> None:
        if not self.config.enable_lora:
            raise Unsupported("LoRA is off: start the worker with --enable-lora")
        async with self._lora_locks.setdefault(name, asyncio.Lock()):
            if not await self._call("unload_lora", name):
                raise EngineError(f"LoRA adapter {name!r} is not loaded")
            self._loras.pop(name, None)

    def list_loras(self) -> list[LoraInfo]:
        return [
            LoraInfo(name=name, path=path, base_model=self.served_name)
            for name, path in sorted(self._loras.items())
        ]

    async def sleep(self, level: int = 1) -> None:
        check_sleep_allowed(self.config)
        if level not in (1, 2):
            raise EngineError(f"sleep level must be 1 or 2, got {level}")
        if self._sleep_level is not None:
            return
        self._sleep_level = level
        for rid in list(self._streams):
            self._finish(
                rid, EngineOutput(finish_reason="error", error="the engine was put to sleep")
            )
        try:
            await self._call("sleep", level)
        except BaseException:
            self._sleep_level = None
            raise

    async def wake(self, tags: list[str] | None = None) -> None:
        check_sleep_allowed(self.config)
        if self._sleep_level is None:
            return
        if not await self._call("wake", tags):
            self._sleep_level = None

    def is_sleeping(self) -> bool:
        return self._sleep_level is not None
