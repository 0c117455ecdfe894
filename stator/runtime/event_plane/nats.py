"""NATS event plane: topics are NATS subjects on a real nats-server.

A subscription matches a topic *prefix* (the EventPlane contract), which NATS wildcards
cannot say exactly ("ns.lo" must match "ns.load"): we subscribe to the wildcard over the
prefix's complete dot-separated tokens (`ns.>`) and drop non-matching topics here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError

from stator.runtime.errors import EventPlaneUnavailable
from stator.runtime.event_plane.base import EventPlane

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0
_STOP = ("\0stop", b"")


def wildcard_for_prefix(prefix: str) -> str:
    """The narrowest NATS subject pattern that covers every topic starting with `prefix`."""
    tokens = prefix.split(".")
    complete = tokens[:-1]  # the last token may be cut short
    return ".".join([*complete, ">"]) if complete else ">"


class NatsEventPlane(EventPlane):
    def __init__(
        self,
        url: str,
        connect_timeout: float = CONNECT_TIMEOUT,
        options: dict[str, Any] | None = None,
    ) -> None:
        self.url = url
        # TLS and credentials (RuntimeConfig.nats_options): tls, user_credentials, token.
        self.options = dict(options or {})
        self.connect_timeout = connect_timeout
        self._nc: NatsClient | None = None
        self._queues: list[asyncio.Queue[tuple[str, bytes]]] = []
        self._lock = asyncio.Lock()
        self._closed = False

    async def start(self) -> None:
        async with self._lock:
            if self._nc is not None:
                return
            if self._closed:
                raise RuntimeError("event plane is closed")
            try:
                # With unlimited reconnects nats-py retries a first connect forever too:
                # bound it, so that a wrong URL is an error rather than a hang.
                connect = nats.connect(
                    self.url,
                    connect_timeout=self.connect_timeout,
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,
                    error_cb=_log_error,
                    **self.options,
                )
                self._nc = await asyncio.wait_for(connect, self.connect_timeout)
            except (NatsError, OSError, TimeoutError) as exc:
                raise EventPlaneUnavailable(f"cannot connect to NATS at {self.url}: {exc}") from exc

    async def publish(self, topic: str, payload: bytes) -> None:
        if self._nc is None:
            await self.start()
        assert self._nc is not None
        await self._nc.publish(topic, payload)

    async def subscribe(self, topic_prefix: str) -> AsyncIterator[tuple[str, bytes]]:
        if self._nc is None:
            await self.start()
        assert self._nc is not None
        queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()

        async def deliver(msg) -> None:
            if msg.subject.startswith(topic_prefix):
                queue.put_nowait((msg.subject, msg.data))

        sub = await self._nc.subscribe(wildcard_for_prefix(topic_prefix), cb=deliver)
        # Make sure the server knows of the subscription before the caller goes on, so
        # that what is published after `subscribe` returns is delivered.
        await self._nc.flush()
        self._queues.append(queue)
        try:
            while True:
                item = await queue.get()
                if item is _STOP:
                    return
                yield item
        finally:
            if queue in self._queues:
                self._queues.remove(queue)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for queue in self._queues:
            queue.put_nowait(_STOP)
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.drain()
            self._nc = None


async def _log_error(exc: Exception) -> None:
    log.warning("NATS: %s", exc)
