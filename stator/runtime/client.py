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
from stator.runtime.errors import CannotConnect, NoInstances
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
                self.instances[iid] = info
                self._notify(iid, info)
            else:
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
        finally:
            await stream.aclose()

    async def call(self, instance_id: int, request: Any) -> list[Any]:
        """Collect a whole (short) stream, for admin-style endpoints."""
        return [item async for item in self.generate(instance_id, request)]

    async def close(self) -> None:
        if self._watch_task is not None:
            await cancel_and_wait([self._watch_task])
            self._watch_task = None
