"""The TCP request plane: many concurrent streams multiplexed on one connection per
(client process, server address), in the frame format of `frames.py`.

Server: each REQUEST frame starts a task that runs the endpoint's handler generator and
sends its items; a CANCEL frame (the caller closed its stream) or a lost connection
cancels that task, so the handler's `finally` runs (this is how an HTTP disconnect
reaches the engine's `abort`).

Client: frames for a stream are queued in that stream's inbox and decoded with the
caller's response type as they are consumed. When the connection breaks, every open
stream raises `StreamDisconnected`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from stator.protocols import decoder
from stator.runtime.errors import (
    CannotConnect,
    ConnectionRefused,
    EndpointNotFound,
    EngineShutdown,
    Migratable,
    RemoteError,
    StreamDisconnected,
)
from stator.runtime.request_plane import frames as f
from stator.runtime.request_plane.base import Handler, RequestClient, RequestServer
from stator.runtime.request_plane.connection import DEAD_AFTER, HEARTBEAT_INTERVAL, Connection
from stator.runtime.security import FleetSecurity, Handshake, HandshakeFailed

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0


def split_address(address: str) -> tuple[str, int]:
    """`host:port` (or `tcp://host:port`, `[v6]:port`) -> (host, port)."""
    text = address.removeprefix("tcp://")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise CannotConnect(f"bad request-plane address {address!r}: expected host:port")
    return host.strip("[]"), int(port)


# -- server ------------------------------------------------------------------------------


def _handshake(security: FleetSecurity | None, server: bool) -> Handshake | None:
    if security is None or security.secret is None:
        return None
    return Handshake(security.secret, server=server)


class _ServerConnection(Connection):
    def __init__(self, server: TcpServer) -> None:
        super().__init__(
            server.heartbeat_interval, server.dead_after, _handshake(server.security, True)
        )
        self.server = server
        self.tasks: dict[int, asyncio.Task] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.server._connections.add(self)

    def on_frame(self, frame: f.Frame) -> None:
        if type(frame) is f.Request:
            self._start(frame)
        elif type(frame) is f.Cancel:
            task = self.tasks.get(frame.stream_id)
            if task is not None:
                task.cancel()

    def _start(self, frame: f.Request) -> None:
        sid = frame.stream_id
        entry = self.server._handlers.get(frame.endpoint)
        if entry is None:
            if frame.endpoint in self.server._retired:
                self.send((f.ERROR, sid, f.ERR_SHUTDOWN, f"{frame.endpoint} is shutting down"))
            else:
                msg = f"{frame.endpoint} is not served at {self.server.address}"
                self.send((f.ERROR, sid, f.ERR_NOT_FOUND, msg))
            return
        handler, request_type = entry
        try:
            request = decoder(request_type).decode(frame.payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.send((f.ERROR, sid, f.ERR_BAD_REQUEST, f"bad request for {frame.endpoint}: {exc}"))
            return
        # Counted from here, not from the task's first step: a drain that starts before
        # the task runs must still wait for it.
        self.server._inflight += 1
        task = self.loop.create_task(self._run(sid, handler, request))
        task.add_done_callback(lambda _, sid=sid: self._finished(sid))
        self.tasks[sid] = task

    def _finished(self, sid: int) -> None:
        self.server._inflight -= 1
        self.tasks.pop(sid, None)

    async def _run(self, sid: int, handler: Handler, request: Any) -> None:
        gen = handler(request)
        send = self.send
        try:
            async for item in gen:
                send((f.ITEM, sid, item))
                if not self._can_write.is_set():
                    await self.writable()
                if self.closed:
                    return
            send((f.END, sid))
        except asyncio.CancelledError:
            pass  # the caller cancelled, or the connection or server went away
        except Migratable as exc:
            # The worker gave the stream up (e.g. its engine died): the caller may migrate.
            send((f.ERROR, sid, f.ERR_SHUTDOWN, f"{type(exc).__name__}: {exc}"))
        except Exception as exc:
            log.debug("handler for stream %d failed", sid, exc_info=True)
            send((f.ERROR, sid, f.ERR_HANDLER, f"{type(exc).__name__}: {exc}"))
        finally:
            with contextlib.suppress(Exception):
                await gen.aclose()

    def on_lost(self, exc: Exception | None) -> None:
        self.server._connections.discard(self)
        for task in list(self.tasks.values()):
            task.cancel()


class TcpServer(RequestServer):
    transport = "tcp"

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        heartbeat_interval: float = HEARTBEAT_INTERVAL,
        dead_after: float = DEAD_AFTER,
        security: FleetSecurity | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.security = security
        self.heartbeat_interval = heartbeat_interval
        self.dead_after = dead_after
        self._handlers: dict[str, tuple[Handler, Any]] = {}
        self._retired: set[str] = set()
        self._connections: set[_ServerConnection] = set()
        self._inflight = 0
        self._server: asyncio.Server | None = None
        self._address = ""

    @property
    def address(self) -> str:
        if not self._address:
            raise RuntimeError("TcpServer.address is known only after start()")
        return self._address

    async def start(self) -> None:
        if self._server is not None:
            return
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _ServerConnection(self),
            self.host,
            self.port,
            reuse_address=True,
            ssl=self.security.server_ssl if self.security else None,
        )
        port = self._server.sockets[0].getsockname()[1]
        host = self.host
        if host in ("", "0.0.0.0", "::"):
            # Bound to every interface: advertise a name other hosts can resolve.
            host = socket.gethostbyname(socket.gethostname())
        self._address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def register(self, endpoint: str, handler: Handler, request_type: Any) -> None:
        self._handlers[endpoint] = (handler, request_type)
        self._retired.discard(endpoint)

    def unregister(self, endpoint: str) -> None:
        if self._handlers.pop(endpoint, None) is not None:
            self._retired.add(endpoint)

    @property
    def inflight(self) -> int:
        return self._inflight

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        tasks = []
        for conn in list(self._connections):
            tasks.extend(conn.tasks.values())
            conn.abort()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 1.0)
        self._server = None


# -- client ------------------------------------------------------------------------------

_DISCONNECTED = object()


class _Inbox:
    """The frames received for one stream, and the consumer waiting for them."""

    __slots__ = ("frames", "waiter")

    def __init__(self) -> None:
        self.frames: deque[Any] = deque()
        self.waiter: asyncio.Future | None = None

    def push(self, frame: Any) -> None:
        self.frames.append(frame)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _ClientConnection(Connection):
    def __init__(
        self,
        address: str,
        heartbeat_interval: float,
        dead_after: float,
        handshake: Handshake | None = None,
    ) -> None:
        super().__init__(heartbeat_interval, dead_after, handshake)
        self.address = address
        self.inboxes: dict[int, _Inbox] = {}
        self._ids = itertools.count(1)
        self.lost_reason = ""

    def open(self, endpoint: str, request: Any) -> tuple[int, _Inbox]:
        sid = next(self._ids)
        self.send((f.REQUEST, sid, endpoint, request))  # raises first if unencodable
        inbox = self.inboxes[sid] = _Inbox()
        if self.closed:  # lost between connecting and this call: fail, never hang
            inbox.push(_DISCONNECTED)
        return sid, inbox

    def on_frame(self, frame: f.Frame) -> None:
        if type(frame) is f.Ping:
            return
        inbox = self.inboxes.get(frame.stream_id)  # type: ignore[union-attr]
        if inbox is not None:
            inbox.push(frame)

    def on_lost(self, exc: Exception | None) -> None:
        self.lost_reason = str(exc) if exc else "connection closed"
        for inbox in self.inboxes.values():
            inbox.push(_DISCONNECTED)


class TcpClient(RequestClient):
    def __init__(
        self,
        *,
        heartbeat_interval: float = HEARTBEAT_INTERVAL,
        dead_after: float = DEAD_AFTER,
        connect_timeout: float = CONNECT_TIMEOUT,
        security: FleetSecurity | None = None,
    ) -> None:
        self.security = security
        self.heartbeat_interval = heartbeat_interval
        self.dead_after = dead_after
        self.connect_timeout = connect_timeout
        self._connections: dict[str, _ClientConnection] = {}
        self._connecting: dict[str, asyncio.Future[_ClientConnection]] = {}

    async def _connection(self, address: str) -> _ClientConnection:
        conn = self._connections.get(address)
        if conn is not None and not conn.closed:
            return conn
        pending = self._connecting.get(address)
        if pending is None:
            pending = asyncio.ensure_future(self._connect(address))
            self._connecting[address] = pending
            pending.add_done_callback(lambda _: self._connecting.pop(address, None))
        # shield: one caller giving up must not abort a connect others wait for.
        return await asyncio.shield(pending)

    async def _connect(self, address: str) -> _ClientConnection:
        host, port = split_address(address)
        loop = asyncio.get_running_loop()
        security = self.security
        tls = security.client_ssl if security else None

        async def connect() -> _ClientConnection:
            _, conn = await loop.create_connection(
                lambda: _ClientConnection(
                    address,
                    self.heartbeat_interval,
                    self.dead_after,
                    _handshake(security, False),
                ),
                host,
                port,
                ssl=tls,
                server_hostname=host if tls else None,
            )
            await conn.ready  # the fleet handshake, when there is one
            return conn

        try:
            conn = await asyncio.wait_for(connect(), self.connect_timeout)
        except ConnectionRefusedError as exc:
            raise ConnectionRefused(f"cannot connect to {address}: {exc}") from exc
        except (OSError, TimeoutError, HandshakeFailed) as exc:
            raise CannotConnect(f"cannot connect to {address}: {exc or 'timed out'}") from exc
        self._connections[address] = conn
        return conn

    async def stream(
        self, address: str, endpoint: str, request: Any, response_type: Any
    ) -> AsyncIterator[Any]:
        conn = await self._connection(address)
        sid, inbox = conn.open(endpoint, request)
        response_decoder = decoder(response_type)
        frames = inbox.frames
        finished = False
        try:
            while True:
                if not frames:
                    inbox.waiter = conn.loop.create_future()
                    await inbox.waiter
                    inbox.waiter = None
                frame = frames.popleft()
                if type(frame) is f.Item:
                    try:
                        item = response_decoder.decode(frame.payload)
                    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                        raise RemoteError(f"undecodable response from {endpoint}: {exc}") from exc
                    yield item
                elif type(frame) is f.End:
                    finished = True
                    return
                elif type(frame) is f.Error:
                    finished = True
                    raise _error(frame, endpoint, address)
                else:
                    finished = True
                    raise StreamDisconnected(
                        f"lost connection to {address} mid-stream ({conn.lost_reason})"
                    )
        finally:
            conn.inboxes.pop(sid, None)
            if not finished:
                conn.send((f.CANCEL, sid))

    async def close(self) -> None:
        for conn in list(self._connections.values()):
            if conn.transport is not None:
                conn.flush()
                conn.transport.close()
        self._connections.clear()


def _error(frame: f.Error, endpoint: str, address: str) -> Exception:
    if frame.code == f.ERR_NOT_FOUND:
        return EndpointNotFound(frame.message)
    if frame.code == f.ERR_SHUTDOWN:
        return EngineShutdown(f"{frame.message} (at {address})")
    return RemoteError(frame.message)
