"""The in-process request plane: a direct call, no serialization.

The handler's generator runs in the caller's task, so a caller that stops iterating closes
the handler's generator directly. Objects are passed by reference; handlers must treat
requests as read-only.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import Any

from stator.runtime.errors import (
    CannotConnect,
    EndpointNotFound,
    Migratable,
    RemoteError,
    StreamDisconnected,
)
from stator.runtime.request_plane.base import Handler, RequestClient, RequestServer

_servers: dict[str, InprocServer] = {}
_ids = itertools.count(1)


class InprocServer(RequestServer):
    transport = "inproc"

    def __init__(self) -> None:
        self._address = f"inproc://{next(_ids)}"
        self._handlers: dict[str, Handler] = {}
        self._inflight = 0
        self._stopped = False

    @property
    def address(self) -> str:
        return self._address

    async def start(self) -> None:
        _servers[self._address] = self

    def register(self, endpoint: str, handler: Handler, request_type: Any) -> None:
        self._handlers[endpoint] = handler

    def unregister(self, endpoint: str) -> None:
        self._handlers.pop(endpoint, None)

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def stopped(self) -> bool:
        return self._stopped

    async def stop(self) -> None:
        self._stopped = True
        _servers.pop(self._address, None)

    async def run(self, endpoint: str, request: Any) -> AsyncIterator[Any]:
        handler = self._handlers.get(endpoint)
        if handler is None:
            raise EndpointNotFound(f"{endpoint} is not served at {self._address}")
        self._inflight += 1
        gen = handler(request)
        try:
            while True:
                if self._stopped:
                    raise StreamDisconnected(f"instance at {self._address} stopped mid-stream")
                try:
                    item = await gen.__anext__()
                except StopAsyncIteration:
                    return
                except Migratable:
                    raise  # the worker gave the stream up: the caller may migrate it
                except Exception as exc:  # the handler's failure, reported to the caller
                    raise RemoteError(f"{type(exc).__name__}: {exc}") from exc
                yield item
        finally:
            self._inflight -= 1
            await gen.aclose()


class InprocClient(RequestClient):
    async def stream(
        self, address: str, endpoint: str, request: Any, response_type: Any
    ) -> AsyncIterator[Any]:
        server = _servers.get(address)
        if server is None or server.stopped:
            raise CannotConnect(f"no in-process server at {address}")
        stream = server.run(endpoint, request)
        try:
            async for item in stream:
                yield item
        finally:
            await stream.aclose()
