"""One TCP connection of the request plane, shared by the server and the client side:
batched frame writes, write back-pressure, and the heartbeat that detects a silently
dead peer (a host that vanished without closing its sockets)."""

from __future__ import annotations

import abc
import asyncio
import logging
import socket
import time
from typing import Any

from stator.runtime.request_plane.frames import PING, Frame, FrameReader, FrameWriter, ProtocolError
from stator.runtime.security import Handshake, HandshakeFailed

log = logging.getLogger(__name__)

# A connection sends a ping after this long without sending anything, and gives the peer
# up after DEAD_AFTER without receiving anything. Generous: a peer whose event loop is busy
# for a few seconds (a long CPU forward pass) must not be declared dead.
HEARTBEAT_INTERVAL = 1.0
DEAD_AFTER = 10.0
# Seconds a new connection has to complete the fleet-secret handshake.
HANDSHAKE_TIMEOUT = 5.0
# Above this many pending bytes, frames are written at once instead of at the end of the
# event-loop turn (a handler that yields without awaiting would otherwise buffer forever).
_FLUSH_NOW = 256 * 1024
_PING_FRAME = (PING,)


class Connection(asyncio.Protocol, abc.ABC):
    """Base protocol: subclasses implement `on_frame` and `on_lost`."""

    def __init__(
        self,
        heartbeat_interval: float = HEARTBEAT_INTERVAL,
        dead_after: float = DEAD_AFTER,
        handshake: Handshake | None = None,
    ) -> None:
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self.closed = False
        self.peer = "?"
        self._writer = FrameWriter()
        self._reader = FrameReader(self.on_frame)
        self._flush_scheduled = False
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._interval = heartbeat_interval
        self._dead_after = dead_after
        self._last_recv = self._last_sent = time.monotonic()
        self._heartbeat: asyncio.TimerHandle | None = None
        # The fleet-secret handshake (stator.runtime.security): until it is done, frames
        # are neither read nor written, only queued.
        self._handshake = handshake
        self.ready: asyncio.Future[None] = self.loop.create_future()
        if handshake is None:
            self.ready.set_result(None)

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            except OSError:
                pass
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        self._heartbeat = self.loop.call_later(self._interval, self._beat)
        if self._handshake is not None:
            greeting = self._handshake.greeting()
            if greeting:
                transport.write(greeting)  # type: ignore[attr-defined]
            self.loop.call_later(HANDSHAKE_TIMEOUT, self._handshake_expired)

    def data_received(self, data: bytes) -> None:
        self._last_recv = time.monotonic()
        if self._handshake is not None and not self._handshake.done:
            try:
                reply, data = self._handshake.feed(data)
            except HandshakeFailed as exc:
                self._fail_handshake(str(exc))
                return
            if reply and self.transport is not None:
                self.transport.write(reply)
            if not self._handshake.done:
                return
            if not self.ready.done():
                self.ready.set_result(None)
            self.flush()
            if not data:
                return
        try:
            self._reader.feed(data)
        except ProtocolError as exc:
            log.warning("closing connection to %s: %s", self.peer, exc)
            self.abort()

    def _fail_handshake(self, why: str) -> None:
        log.warning("closing request-plane connection with %s: %s", self.peer, why)
        self._set_failed(why)
        self.abort()

    def _set_failed(self, why: str) -> None:
        if not self.ready.done():
            self.ready.set_exception(HandshakeFailed(why))
            self.ready.exception()  # marked retrieved: a server side never awaits it

    def _handshake_expired(self) -> None:
        if self._handshake is not None and not self._handshake.done and not self.closed:
            self._fail_handshake(f"no fleet handshake within {HANDSHAKE_TIMEOUT:.0f}s")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._set_failed(f"connection lost: {exc or 'closed'}")
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        self._can_write.set()  # wake writers; they see `closed`
        self.on_lost(exc)

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    # -- for subclasses --------------------------------------------------------------

    @abc.abstractmethod
    def on_frame(self, frame: Frame) -> None: ...

    @abc.abstractmethod
    def on_lost(self, exc: Exception | None) -> None: ...

    def send(self, frame: tuple[Any, ...]) -> None:
        """Queue a frame; it goes out at the end of this event-loop turn."""
        if self.closed:
            return
        self._writer.add(frame)
        if not self._flush_scheduled:
            # The first frame of an event-loop turn goes out at once (latency); frames
            # that follow in the same turn are batched into one write at its end.
            self.flush()
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)
        elif len(self._writer.buffer) >= _FLUSH_NOW:
            self.flush()
            self._flush_scheduled = True

    def flush(self) -> None:
        self._flush_scheduled = False
        if self.closed or not self._writer.buffer or self.transport is None:
            return
        if self._handshake is not None and not self._handshake.done:
            return  # queued until the peer has proved itself
        self.transport.write(self._writer.take())
        self._last_sent = time.monotonic()

    async def writable(self) -> None:
        """Wait while the socket's send buffer is full (a slow reader)."""
        if not self._can_write.is_set():
            await self._can_write.wait()

    def abort(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.abort()

    def _beat(self) -> None:
        if self.closed:
            return
        now = time.monotonic()
        if now - self._last_recv > self._dead_after:
            log.warning(
                "peer %s silent for %.1fs: closing the connection", self.peer, self._dead_after
            )
            self.abort()
            return
        if now - self._last_sent >= self._interval:
            self.send(_PING_FRAME)
        self._heartbeat = self.loop.call_later(self._interval, self._beat)
