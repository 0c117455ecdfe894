"""In-process pub/sub: a bus shared by every `InprocEventPlane` with the same name."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from stator.runtime.event_plane.base import EventPlane

_STOP = ("\0stop", b"")


class _Bus:
    def __init__(self) -> None:
        self.subscribers: list[tuple[str, asyncio.Queue[tuple[str, bytes]]]] = []


_buses: dict[str, _Bus] = {}


class InprocEventPlane(EventPlane):
    def __init__(self, name: str = "default") -> None:
        self._bus = _buses.setdefault(name, _Bus())
        self._queues: list[asyncio.Queue[tuple[str, bytes]]] = []

    async def publish(self, topic: str, payload: bytes) -> None:
        for prefix, queue in self._bus.subscribers:
            if topic.startswith(prefix):
                queue.put_nowait((topic, payload))

    async def subscribe(self, topic_prefix: str) -> AsyncIterator[tuple[str, bytes]]:
        queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
        entry = (topic_prefix, queue)
        self._bus.subscribers.append(entry)
        self._queues.append(queue)
        try:
            while True:
                item = await queue.get()
                if item is _STOP:
                    return
                yield item
        finally:
            if entry in self._bus.subscribers:
                self._bus.subscribers.remove(entry)
            if queue in self._queues:
                self._queues.remove(queue)

    async def close(self) -> None:
        for queue in self._queues:
            queue.put_nowait(_STOP)
