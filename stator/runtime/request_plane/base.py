"""Request plane: how a caller opens a stream of responses from an instance's endpoint.

A handler is an async generator function: it takes one decoded request object and yields
response objects. The caller iterates the stream; closing it early (`aclose()`, or the
iterating task being cancelled) cancels the handler on the other side, whose `finally`
blocks run, which is how a closed HTTP connection reaches the engine's `abort`.

If the instance dies mid-stream the caller gets `StreamDisconnected` (migratable); if the
handler raises, `RemoteError` with its message.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable
from typing import Any

Handler = Callable[[Any], AsyncIterator[Any]]


class RequestServer(abc.ABC):
    """The serving side in one process: endpoints by name, one listening address."""

    transport: str

    @property
    @abc.abstractmethod
    def address(self) -> str:
        """Where clients reach this server (valid after `start`)."""

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    def register(self, endpoint: str, handler: Handler, request_type: Any) -> None:
        """Serve `endpoint` ("ns.component.endpoint"). `request_type` tells transports that
        serialize how to decode requests (a msgspec Struct type or `Any`)."""

    @abc.abstractmethod
    def unregister(self, endpoint: str) -> None:
        """Stop accepting new streams for `endpoint`; running streams continue."""

    @property
    @abc.abstractmethod
    def inflight(self) -> int:
        """Streams currently running."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Stop at once: running streams are cut (callers see `StreamDisconnected`)."""


class RequestClient(abc.ABC):
    """The calling side: one per process and transport, shared by all `Client`s."""

    @abc.abstractmethod
    def stream(
        self, address: str, endpoint: str, request: Any, response_type: Any
    ) -> AsyncIterator[Any]:
        """Open a stream to `endpoint` at `address` and yield decoded responses."""

    async def close(self) -> None:
        """Release connections."""
