"""LoRA adapters and sleep mode of the in-process `NativeEngine` (mixed into it): each
change reaches the core between two steps, or in the step thread for sleep and wake."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from stator.engines.base import EngineError, Unsupported
from stator.engines.native.config import NativeConfig
from stator.engines.native.lora.adapter import load_adapter, pin_adapter
from stator.engines.native.lora.resolve import resolve_adapter
from stator.protocols import EngineOutput, LoraInfo

log = logging.getLogger("stator.engines.native.engine")
T = TypeVar("T")


def check_sleep_allowed(config: NativeConfig) -> None:
    if not config.enable_sleep_mode:
        raise Unsupported("sleep mode is off: start the worker with --enable-sleep-mode")
    if config.tensor_parallel_size > 1:
        raise Unsupported("sleep mode does not work with tensor parallelism yet")
    if config.kv_offloading_size > 0 or config.disk_offload_dir:
        # The offload tiers hold the KV pool that sleep frees and wake allocates anew.
        raise Unsupported("sleep mode does not work with KV offload tiers yet")


def check_lora_name(config: NativeConfig, name: str, served_name: str) -> None:
    if not config.enable_lora:
        raise Unsupported("LoRA is off: start the worker with --enable-lora")
    if name == served_name:
        raise EngineError(f"a LoRA adapter cannot take the base model's name {name!r}")


class LoraAndSleep:
    # -- LoRA ----------------------------------------------------------------------------

    async def load_lora(self, name: str, path: str) -> LoraInfo:
        allowed = list(self.config.lora_allowed_dirs)
        return await self._load_lora(name, path, allowed_dirs=allowed)

    async def _load_lora(
        self, name: str, source: str, *, allowed_dirs: list[str] | None
    ) -> LoraInfo:
        core = self._core()
        check_lora_name(self.config, name, self.served_name)
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
        check_sleep_allowed(self.config)

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
