"""In-process discovery: a dict shared by every `MemDiscovery` with the same store name.

Used by `stator run` (everything in one process) and by unit tests.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

from stator.runtime.discovery.base import Discovery, WatchEvent

_STOP = WatchEvent("delete", "\0stop")


class MemStore:
    """The shared state: key -> (value, owner lease) and the open watches."""

    def __init__(self) -> None:
        self.entries: dict[str, tuple[bytes, int]] = {}
        self.watchers: list[tuple[str, asyncio.Queue[WatchEvent]]] = []

    def notify(self, event: WatchEvent) -> None:
        for prefix, queue in self.watchers:
            if event.key.startswith(prefix):
                queue.put_nowait(event)


_stores: dict[str, MemStore] = {}


def mem_store(name: str = "default") -> MemStore:
    store = _stores.get(name)
    if store is None:
        store = _stores[name] = MemStore()
    return store


class MemDiscovery(Discovery):
    def __init__(self, store: str | MemStore = "default") -> None:
        self.store = store if isinstance(store, MemStore) else mem_store(store)
        self.lease_id = random.getrandbits(63) or 1
        self._queues: list[asyncio.Queue[WatchEvent]] = []
        self._closed = False

    async def put(self, key: str, value: bytes) -> None:
        self._check_open()
        self.store.entries[key] = (value, self.lease_id)
        self.store.notify(WatchEvent("put", key, value))

    async def delete(self, key: str) -> None:
        if self.store.entries.pop(key, None) is not None:
            self.store.notify(WatchEvent("delete", key))

    async def get_prefix(self, prefix: str) -> dict[str, bytes]:
        return {k: v for k, (v, _) in self.store.entries.items() if k.startswith(prefix)}

    async def watch(self, prefix: str) -> AsyncIterator[WatchEvent]:
        self._check_open()
        queue: asyncio.Queue[WatchEvent] = asyncio.Queue()
        entry = (prefix, queue)
        # Register before the snapshot: no await between them, so nothing is missed.
        self.store.watchers.append(entry)
        self._queues.append(queue)
        try:
            for key, (value, _) in list(self.store.entries.items()):
                if key.startswith(prefix):
                    yield WatchEvent("put", key, value)
            while True:
                event = await queue.get()
                if event is _STOP:
                    return
                yield event
        finally:
            if entry in self.store.watchers:
                self.store.watchers.remove(entry)
            if queue in self._queues:
                self._queues.remove(queue)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        owned = [k for k, (_, lease) in self.store.entries.items() if lease == self.lease_id]
        for key in owned:
            await self.delete(key)
        for queue in self._queues:
            queue.put_nowait(_STOP)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("discovery is closed")
