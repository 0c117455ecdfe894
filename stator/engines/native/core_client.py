"""`CoreProcessEngine`: the native engine with its core in a process of its own.

The worker host serves this `Engine`; the `EngineCore` runs in `core_process.py`, a child
started here, so the core's loop never waits on the host's asyncio, HTTP or per-request
Python. Inputs (adds, aborts) made in one event-loop turn go out as one frame; each step
comes back as one frame, which `_dispatch` spreads over the requests' streams. A stream
whose reader has fallen behind merges its waiting deltas into one (`_Stream.take`), so a
busy host does less work per token instead of more.

When the core process dies (a crash, a failed step, a kill), every request in flight ends
with `EngineDead`, and `health_check` fails: the host unregisters and its owner exits,
instead of streams that hang.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from stator.engines.base import Engine, EngineDead, EngineError, Unsupported
from stator.engines.native.config import ModelSpec, NativeConfig
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
    CoreReady,
    Shutdown,
    StepOutputs,
)
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

_REPO_ROOT = Path(__file__).resolve().parents[3]
_STOP_GRACE_S = 30.0
# After the core's pipe closes, how long a `CoreFailed` frame (the precise reason) may take
# to arrive before the death is reported with the exit code alone.
_LAST_WORDS_S = 0.2


class _Stream:
    """One request's deltas, waiting for its reader."""

    __slots__ = ("cached", "emitted", "items", "prompt_tokens", "waiter")

    def __init__(self, prompt_tokens: int) -> None:
        self.items: collections.deque[EngineOutput | BaseException] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None
        self.prompt_tokens = prompt_tokens
        self.emitted = 0
        self.cached = 0

    def put(self, item: EngineOutput | BaseException) -> None:
        self.items.append(item)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def take(self) -> EngineOutput:
        while not self.items:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
            self.waiter = None
        first = self.items.popleft()
        if isinstance(first, BaseException):
            raise first
        # Deltas that piled up while the reader was busy go out as one.
        while self.items and first.finish_reason is None:
            nxt = self.items[0]
            if isinstance(nxt, BaseException) or nxt.prompt_logprobs is not None:
                break
            if (first.logprobs is None) != (nxt.logprobs is None):
                break
            self.items.popleft()
            first.token_ids.extend(nxt.token_ids)
            if first.logprobs is not None and nxt.logprobs is not None:
                first.logprobs.extend(nxt.logprobs)
            first.finish_reason, first.stop_token_id = nxt.finish_reason, nxt.stop_token_id
            first.error, first.error_code = nxt.error, nxt.error_code
            first.usage, first.disagg = nxt.usage, nxt.disagg
        return first


class CoreProcessEngine(Engine):
    def __init__(self, config: NativeConfig, model_path: str, served_name: str) -> None:
        self.config = config
        self.model_path = str(model_path)
        self.served_name = served_name
        # Fail fast on a directory we cannot serve (missing config, unknown architecture).
        model_class(ModelSpec.from_dir(model_path).architecture)
        self.info: CoreInfo | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._streams: dict[str, _Stream] = {}
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
        self._tmp: tempfile.TemporaryDirectory | None = None
        self._death_fd: int | None = None
        self._push: zmq.Socket | None = None
        self._pull: zmq.asyncio.Socket | None = None
        self._contexts: list[zmq.Context] = []

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        if self.role != "aggregated":
            raise EngineError(
                f"--role {self.role}: the KV transfer agent runs next to the core; start the "
                "worker with --engine-core-process off"
            )
        loop = asyncio.get_running_loop()
        self._tmp = tempfile.TemporaryDirectory(prefix="stator-core-")
        inputs, outputs = (f"ipc://{self._tmp.name}/{n}" for n in ("inputs", "outputs"))
        sync_ctx, async_ctx = zmq.Context(), zmq.asyncio.Context()
        self._contexts = [sync_ctx, async_ctx]
        self._push = sync_ctx.socket(zmq.PUSH)
        self._push.setsockopt(zmq.SNDHWM, 0)
        self._push.bind(inputs)
        self._pull = async_ctx.socket(zmq.PULL)
        self._pull.bind(outputs)
        args = {
            "config": msgspec.to_builtins(self.config),
            "model_dir": self.model_path,
            "worker_id": self.worker_id,
            "inputs": inputs,
            "outputs": outputs,
            "log_level": logging.getLevelName(logging.getLogger().getEffectiveLevel()),
        }
        # The core holds `write` open for its whole life: EOF on `read` is its death.
        read, write = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        cmd = [sys.executable, "-m", "stator.engines.native.core_process", json.dumps(args)]
        try:
            # stdin stays open for the core's whole life: its EOF tells the core to exit.
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, env=env, pass_fds=(write,))
        finally:
            os.close(write)
        self._death_fd = read
        exited = loop.create_future()
        loop.add_reader(read, self._on_core_exit, exited)
        first = asyncio.ensure_future(self._pull.recv())
        try:
            await asyncio.wait({first, exited}, return_when=asyncio.FIRST_COMPLETED)
            if not first.done():
                await asyncio.wait({first}, timeout=_LAST_WORDS_S)
            if not first.done():
                raise EngineError(f"the engine core process exited ({self._exit_status()})")
            message = OUTPUT_DECODER.decode(first.result())
            if isinstance(message, CoreFailed):
                raise EngineError(f"the engine core failed to start: {message.reason}")
            assert isinstance(message, CoreReady), message
        except BaseException:
            first.cancel()
            await self._close()
            raise
        self.info = message.info
        self._loras = dict(message.loras)
        self._reader = asyncio.create_task(self._read(), name="native-core-reader")
        log.info("engine core process started (pid %d)", self.proc.pid)

    def _on_core_exit(self, exited: asyncio.Future[None]) -> None:
        loop = asyncio.get_running_loop()
        assert self._death_fd is not None
        loop.remove_reader(self._death_fd)
        if not exited.done():
            exited.set_result(None)
        if self._reader is not None:
            loop.call_later(_LAST_WORDS_S, self._on_core_gone)

    def _on_core_gone(self) -> None:
        self._die(f"the engine core process exited ({self._exit_status()})")

    def _exit_status(self) -> str:
        code = None
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self.proc.wait(timeout=_LAST_WORDS_S)
        return "still running" if code is None else f"code {code}"

    async def shutdown(self) -> None:
        if self.proc is not None and self.proc.poll() is None and self._dead is None:
            self._outbox.append(Shutdown())
            self._flush()
        for rid in list(self._streams):
            self._finish(rid, EngineOutput(finish_reason="abort"))
        await self._close()

    async def _close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
            self._reader = None
        proc = self.proc
        if proc is not None:
            if proc.stdin is not None:
                proc.stdin.close()  # the core exits on EOF even when its loop is stuck
            loop = asyncio.get_running_loop()
            try:
                await asyncio.wait_for(loop.run_in_executor(None, proc.wait), _STOP_GRACE_S)
            except TimeoutError:
                log.warning("engine core pid %d did not stop; killing it", proc.pid)
                proc.kill()
                await loop.run_in_executor(None, proc.wait)
        if self._death_fd is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._death_fd)
            os.close(self._death_fd)
            self._death_fd = None
        for sock in (self._push, self._pull):
            if sock is not None:
                sock.close(linger=0)
        for ctx in self._contexts:
            ctx.term()
        self._contexts = []
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    async def health_check(self) -> None:
        if self._dead is not None:
            raise EngineDead(self._dead)
        if self.proc is None or self.proc.poll() is not None:
            raise EngineDead("the engine core process is not running")

    # -- requests ------------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        self._alive()
        if self._sleep_level is not None:
            raise EngineError(
                f"the engine is asleep (sleep level {self._sleep_level}): wake it up first"
            )
        if not request.lora_name and request.model in self._loras:
            # A request to an adapter's own model card names the adapter as its model.
            request = msgspec.structs.replace(request, lora_name=request.model)
        rid = request.request_id
        if rid in self._streams:
            raise EngineError(f"request id {rid!r} is already running")
        stream = _Stream(len(request.token_ids))
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
        if self._dead is None and self.proc is not None:
            self._send(AbortRequest(request_id))

    def _send(self, item: CoreInput) -> None:
        if not self._outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self._outbox.append(item)

    def _flush(self) -> None:
        items, self._outbox = self._outbox, []
        if items and self._push is not None and self._dead is None:
            self._push.send(ENCODER.encode(CoreInputs(items=items)), zmq.NOBLOCK, copy=False)

    async def _read(self) -> None:
        assert self._pull is not None
        while True:
            frame = await self._pull.recv(copy=False)
            self._dispatch(OUTPUT_DECODER.decode(frame.buffer))

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
