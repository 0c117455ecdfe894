"""ZMQ event plane: no broker. Each process binds one PUB socket on its host (any free
port) and announces the address in discovery under its lease, so the announcement
disappears with the process. Each subscription is a SUB socket that watches the
announcements and connects to (or disconnects from) publishers as they come and go.

Messages are two frames, [topic, payload]; ZMQ filters on the topic's prefix at the
publisher. As with any PUB/SUB, messages published before a subscriber's connection is
up are not delivered to it (consumers that need completeness detect gaps by event id).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator

import zmq
import zmq.asyncio

from stator.runtime.discovery import Discovery
from stator.runtime.event_plane.base import EventPlane
from stator.runtime.names import EVENT_CHANNELS_ROOT, event_channel_key

log = logging.getLogger(__name__)

CHANNEL = "zmq"  # the discovery "topic" under which PUB addresses are announced
_STOP = ("\0stop", b"")


class ZmqEventPlane(EventPlane):
    def __init__(self, discovery: Discovery, namespace: str, host: str = "127.0.0.1") -> None:
        self.discovery = discovery
        self.namespace = namespace
        self.host = host
        self.address = ""
        self._ctx: zmq.asyncio.Context | None = None
        self._pub: zmq.asyncio.Socket | None = None
        self._key = ""
        self._queues: list[asyncio.Queue[tuple[str, bytes]]] = []
        self._start_lock = asyncio.Lock()
        self._closed = False

    @property
    def _channels_prefix(self) -> str:
        return f"{EVENT_CHANNELS_ROOT}{self.namespace}/{CHANNEL}/"

    def _context(self) -> zmq.asyncio.Context:
        if self._ctx is None:
            self._ctx = zmq.asyncio.Context()
        return self._ctx

    async def start(self) -> None:
        async with self._start_lock:
            if self._pub is not None:
                return
            if self._closed:
                raise RuntimeError("event plane is closed")
            pub = self._context().socket(zmq.PUB)
            pub.setsockopt(zmq.LINGER, 0)
            bind_host = self.host or "0.0.0.0"
            port = pub.bind_to_random_port(f"tcp://{bind_host}")
            advertised = bind_host
            if bind_host in ("0.0.0.0", "*", "::"):
                advertised = socket.gethostbyname(socket.gethostname())
            self.address = f"tcp://{advertised}:{port}"
            self._pub = pub
            self._key = event_channel_key(self.namespace, CHANNEL, self.discovery.lease_id)
            await self.discovery.put(self._key, self.address.encode())

    async def publish(self, topic: str, payload: bytes) -> None:
        if self._pub is None:
            await self.start()
        assert self._pub is not None
        # PUB never blocks: past the high-water mark ZMQ drops, which is the contract.
        await self._pub.send_multipart([topic.encode(), payload])

    async def subscribe(self, topic_prefix: str) -> AsyncIterator[tuple[str, bytes]]:
        if self._closed:
            raise RuntimeError("event plane is closed")
        sub = self._context().socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, topic_prefix.encode())
        queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
        self._queues.append(queue)
        tasks = [
            asyncio.create_task(self._follow_publishers(sub), name="zmq follow publishers"),
            asyncio.create_task(self._receive(sub, queue), name="zmq receive"),
        ]
        try:
            while True:
                item = await queue.get()
                if item is _STOP:
                    return
                yield item
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            sub.close(linger=0)
            if queue in self._queues:
                self._queues.remove(queue)

    async def _follow_publishers(self, sub: zmq.asyncio.Socket) -> None:
        connected: dict[str, str] = {}  # discovery key -> address
        async for event in self.discovery.watch(self._channels_prefix):
            old = connected.pop(event.key, None)
            if old is not None:
                with contextlib.suppress(zmq.ZMQError):
                    sub.disconnect(old)
            if event.kind == "put":
                address = event.value.decode()
                try:
                    sub.connect(address)
                except zmq.ZMQError as exc:
                    log.warning("cannot connect to event publisher %s: %s", address, exc)
                    continue
                connected[event.key] = address

    async def _receive(self, sub: zmq.asyncio.Socket, queue: asyncio.Queue) -> None:
        while True:
            frames = await sub.recv_multipart()
            if len(frames) != 2:
                continue  # not one of ours
            try:
                queue.put_nowait((frames[0].decode(), frames[1]))
            except UnicodeDecodeError:
                log.warning("dropping event with a non-UTF-8 topic")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for queue in self._queues:
            queue.put_nowait(_STOP)
        if self._key:
            with contextlib.suppress(Exception):
                await self.discovery.delete(self._key)
        if self._pub is not None:
            self._pub.close(linger=0)
            self._pub = None
        # Subscriptions close their own sockets when their consumers see the stop; the
        # context is left to the garbage collector so that no socket is torn from under one.
