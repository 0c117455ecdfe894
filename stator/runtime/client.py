"""`Client`: the caller's view of one endpoint — its live instances, and streams to them.

Routing policy lives in `stator.router`; a client only knows who is alive and how to
reach a chosen instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from stator.protocols import decode
from stator.runtime.errors import CannotConnect, ConnectionRefused, NoInstances
from stator.runtime.names import EndpointName, InstanceInfo, instance_id_from_key, instances_prefix
from stator.runtime.tasks import cancel_and_wait

if TYPE_CHECKING:
    from stator.runtime.runtime import Runtime

log = logging.getLogger(__name__)

# Called with (instance_id, info or None when removed).
InstanceListener = Callable[[int, InstanceInfo | None], None]


class Client:
    def __init__(self, runtime: Runtime, endpoint: EndpointName, response_type: Any) -> None:
        self.runtime = runtime
        self.endpoint = endpoint
        self.response_type = response_type
        self.instances: dict[int, InstanceInfo] = {}
        self._listeners: list[InstanceListener] = []
        self._changed = asyncio.Event()
        self._watch_task: asyncio.Task | None = None
        self._ready = asyncio.Event()
        # Instances whose address refused a connection: out of `instances` until discovery
        # removes them or `DOWN_SECONDS` pass (then they are tried again).
        self._down: dict[int, tuple[InstanceInfo, asyncio.TimerHandle]] = {}

    async def start(self) -> None:
        if self._watch_task is None:
            self._watch_task = asyncio.create_task(self._watch(), name=f"watch {self.endpoint}")
            # The initial snapshot arrives at once; give the task a turn to read it.
            await asyncio.sleep(0)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), 0.5)

    async def _watch(self) -> None:
        prefix = instances_prefix(self.endpoint)
        # Backends report the snapshot first; mark ready once the current keys are in.
        snapshot = await self.runtime.discovery.get_prefix(prefix)
        pending = set(snapshot)
        if not pending:
            self._ready.set()
        async for event in self.runtime.discovery.watch(prefix):
            try:
                iid = instance_id_from_key(event.key)
            except (IndexError, ValueError):
                continue
            if event.kind == "put":
                try:
                    info = decode(event.value, InstanceInfo)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    log.warning("ignoring malformed instance record %s", event.key)
                    continue
                self._forget_down(iid)
                self.instances[iid] = info
                self._notify(iid, info)
            else:
                self._forget_down(iid)
                if self.instances.pop(iid, None) is not None:
                    self._notify(iid, None)
            pending.discard(event.key)
            if not pending:
                self._ready.set()

    def _notify(self, iid: int, info: InstanceInfo | None) -> None:
        self._changed.set()
        self._changed = asyncio.Event()
        for listener in self._listeners:
            try:
                listener(iid, info)
            except Exception:
                log.exception("instance listener failed")

    def mark_down(self, instance_id: int, seconds: float | None = None) -> None:
        """Take an instance out of `instances` now (its address refused a connection: a
        killed worker whose discovery entry has not expired yet). It comes back after
        `seconds` (default: the discovery TTL) unless discovery removes it first."""
        info = self.instances.pop(instance_id, None)
        if info is None:
            return
        if seconds is None:
            seconds = max(1.0, self.runtime.config.discovery_ttl)
        log.warning(
            "instance %x of %s refused a connection: marked down for %.0fs",
            instance_id,
            self.endpoint,
            seconds,
        )
        timer = asyncio.get_running_loop().call_later(seconds, self._back_up, instance_id)
        self._down[instance_id] = (info, timer)
        self._notify(instance_id, None)

    def _back_up(self, instance_id: int) -> None:
        entry = self._down.pop(instance_id, None)
        if entry is not None and instance_id not in self.instances:
            self.instances[instance_id] = entry[0]
            self._notify(instance_id, entry[0])

    def _forget_down(self, instance_id: int) -> None:
        entry = self._down.pop(instance_id, None)
        if entry is not None:
            entry[1].cancel()

    def on_change(self, listener: InstanceListener) -> None:
        """Call `listener` whenever an instance appears or disappears."""
        self._listeners.append(listener)

    def instance_ids(self) -> list[int]:
        return list(self.instances)

    async def wait_for_instances(self, count: int = 1, timeout: float = 30.0) -> list[int]:
        """Wait until at least `count` instances are live."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self.instances) < count:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise NoInstances(
                    f"{len(self.instances)} of {count} instances of {self.endpoint} after {timeout}s"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        return self.instance_ids()

    async def generate(self, instance_id: int, request: Any) -> AsyncIterator[Any]:
        """Stream responses from one chosen instance. Closing this iterator early cancels
        the request on the instance."""
        info = self.instances.get(instance_id)
        if info is None:
            raise CannotConnect(f"instance {instance_id:x} of {self.endpoint} is not live")
        transport = self.runtime.request_client(info.transport)
        stream = transport.stream(info.address, str(self.endpoint), request, self.response_type)
        try:
            async for item in stream:
                yield item
        except ConnectionRefused:
            self.mark_down(instance_id)
            raise
        finally:
            await stream.aclose()

    async def call(self, instance_id: int, request: Any) -> list[Any]:
        """Collect a whole (short) stream, for admin-style endpoints."""
        return [item async for item in self.generate(instance_id, request)]

    async def close(self) -> None:
        for _, timer in self._down.values():
            timer.cancel()
        self._down.clear()
        if self._watch_task is not None:
            await cancel_and_wait([self._watch_task])
            self._watch_task = None
