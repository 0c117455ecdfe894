"""The worker's admin endpoint (`<namespace>.<component>.admin`): one `AdminRequest` in,
one `AdminResponse` out. Operations map onto the optional `Engine` hooks; an engine that
lacks one answers ok=False with a message saying so, never a crash."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec

from stator.engines.base import Engine, EngineError
from stator.protocols import AdminRequest, AdminResponse

log = logging.getLogger(__name__)


class AdminOps:
    """Dispatches admin ops to `engine`. `on_loras_changed` runs after a LoRA adapter is
    loaded or unloaded (the host republishes its card then)."""

    def __init__(
        self,
        engine: Engine,
        on_loras_changed: Callable[[], Awaitable[None]] | None = None,
        *,
        before_sleep: Callable[[], Awaitable[None]] | None = None,
        after_wake: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.engine = engine
        self.on_loras_changed = on_loras_changed
        # The host leaves discovery before the engine sleeps and returns once it is awake.
        self.before_sleep = before_sleep
        self.after_wake = after_wake
        self.ops: dict[str, Callable[[dict[str, Any]], Awaitable[Any]]] = {
            "clear_kv": self._clear_kv,
            "kv_state": self._kv_state,
            "kv_release": self._kv_release,
            "load_lora": self._load_lora,
            "unload_lora": self._unload_lora,
            "list_loras": self._list_loras,
            "sleep": self._sleep,
            "wake": self._wake,
            "is_sleeping": self._is_sleeping,
        }

    async def handle(self, request: AdminRequest) -> AdminResponse:
        op = self.ops.get(request.op)
        if op is None:
            known = ", ".join(sorted(self.ops))
            return AdminResponse(ok=False, error=f"unknown admin op {request.op!r}; known: {known}")
        try:
            result = await op(request.args)
        except EngineError as exc:  # includes Unsupported: the engine's own words
            return AdminResponse(ok=False, error=str(exc))
        except (KeyError, TypeError, ValueError) as exc:
            return AdminResponse(ok=False, error=f"bad arguments for {request.op}: {exc}")
        except Exception as exc:
            log.exception("admin op %s failed", request.op)
            return AdminResponse(
                ok=False, error=f"{request.op} failed: {type(exc).__name__}: {exc}"
            )
        # Plain data, so the answer reads the same over every request plane.
        return AdminResponse(ok=True, result=msgspec.to_builtins(result))

    async def _clear_kv(self, args: dict[str, Any]) -> None:
        await self.engine.clear_kv()

    async def _kv_state(self, args: dict[str, Any]) -> Any:
        state = self.engine.kv_state()
        # An engine whose cache lives in another process answers asynchronously.
        return await state if inspect.isawaitable(state) else state

    async def _kv_release(self, args: dict[str, Any]) -> bool:
        pin = _required_str(args, "id")
        unless_claimed, later = _flag(args, "unless_claimed"), _flag(args, "later")
        return await self.engine.release_kv(pin, unless_claimed, later)

    async def _load_lora(self, args: dict[str, Any]) -> Any:
        name, path = _required_str(args, "name"), _required_str(args, "path")
        info = await self.engine.load_lora(name, path)
        await self._loras_changed()
        return info

    async def _unload_lora(self, args: dict[str, Any]) -> None:
        await self.engine.unload_lora(_required_str(args, "name"))
        await self._loras_changed()

    async def _list_loras(self, args: dict[str, Any]) -> Any:
        return self.engine.list_loras()

    async def _sleep(self, args: dict[str, Any]) -> None:
        level = args.get("level", 1)
        if not isinstance(level, int) or isinstance(level, bool) or level < 1:
            raise ValueError(f"level must be a positive integer, got {level!r}")
        if self.before_sleep is not None:
            await self.before_sleep()
        try:
            await self.engine.sleep(level)
        except BaseException:
            if self.after_wake is not None:  # still awake: serve again
                await self.after_wake()
            raise

    async def _wake(self, args: dict[str, Any]) -> Any:
        tags = args.get("tags")
        if tags is not None and not (
            isinstance(tags, list) and all(isinstance(t, str) for t in tags)
        ):
            raise ValueError(f"tags must be a list of strings, got {tags!r}")
        await self.engine.wake(tags)
        asleep = self.engine.is_sleeping()
        if not asleep and self.after_wake is not None:
            await self.after_wake()
        return {"is_sleeping": asleep}

    async def _is_sleeping(self, args: dict[str, Any]) -> Any:
        return {"is_sleeping": self.engine.is_sleeping()}

    async def _loras_changed(self) -> None:
        if self.on_loras_changed is not None:
            await self.on_loras_changed()


def _required_str(args: dict[str, Any], key: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key!r} (a non-empty string) is required")
    return value


def _flag(args: dict[str, Any], key: str) -> bool:
    value = args.get(key, False)
    if not isinstance(value, bool):
        raise ValueError(f"{key!r} must be true or false, not {value!r}")
    return value
