"""uvicorn's HTTP protocol with the connection-level limits uvicorn lacks.

A black-box probe held the frontend with 1,000 idle connections, with clients that sent
half their headers or half a body and then waited (each held for over a minute), and
made `/live` fail with 1,100 idle connections. Here:

- a connection gets `header_timeout` seconds to send each request's head (the time from
  connecting, or from the last response, to the end of the headers), then it is closed;
- a request gets `body_timeout` seconds from its head to the end of its body;
- a head over `max_header_bytes` is answered 431 and the connection closed;
- past `max_connections` open connections a new one gets a 503 (`Retry-After: 1`) and is
  closed, so the process never runs out of file descriptors for the ones it serves.

Idle keep-alive connections keep uvicorn's own `timeout_keep_alive`.
"""

from __future__ import annotations

import asyncio
import resource
from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# Descriptors kept back from --max-connections for everything else (sockets to workers,
# discovery, the event plane, files).
_RESERVED_FDS = 256
DEFAULT_MAX_CONNECTIONS = 8192


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    max_header_bytes: int = 64 << 10
    max_connections: int = DEFAULT_MAX_CONNECTIONS


def raise_open_files_limit() -> int:
    """Raise this process's soft open-files limit to its hard limit; return the soft one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


def max_connections(configured: int) -> int:
    """--max-connections, or the default under this process's open-files limit."""
    if configured > 0:
        return configured
    soft = raise_open_files_limit()
    return max(16, min(DEFAULT_MAX_CONNECTIONS, soft - _RESERVED_FDS))


def _canned(status: str, body: bytes, extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n"
    ).encode() + body


_BUSY = _canned(
    "503 Service Unavailable",
    b'{"error":{"message":"Too many open connections; retry later.","type":'
    b'"service_unavailable","param":null,"code":"too_many_connections"}}',
    "retry-after: 1\r\n",
)
_HEAD_TOO_LARGE = _canned(
    "431 Request Header Fields Too Large",
    b'{"error":{"message":"The request headers are too large.","type":'
    b'"invalid_request_error","param":null,"code":"headers_too_large"}}',
)


def limited_protocol(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """The protocol class to give uvicorn (`http=`), bound to `limits`."""

    class LimitedHttpToolsProtocol(HttpToolsProtocol):
        _limits = limits

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._head_bytes = 0
            self._head_size = 0
            self._in_head = True
            self._deadline: asyncio.TimerHandle | None = None
            if len(self.connections) > self._limits.max_connections:
                transport.write(_BUSY)
                transport.close()
                return
            self._arm(self._limits.header_timeout)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self, seconds: float) -> None:
            self._disarm()
            if seconds > 0:
                self._deadline = self.loop.call_later(seconds, self._expire)

        def _disarm(self) -> None:
            deadline = getattr(self, "_deadline", None)
            if deadline is not None:
                deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            # A request whose response has begun is the app's to finish; a client too slow
            # to send its head or body is cut off.
            if (
                self.cycle is None
                or self.cycle.response_complete
                or not self.cycle.response_started
            ):
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._in_head:
                self._head_bytes += len(data)
            super().data_received(data)
            # Counted after parsing: the chunk that ends a head may carry body bytes too.
            if (
                self._in_head
                and self._head_bytes > self._limits.max_header_bytes
                and not self.transport.is_closing()
            ):
                self.transport.write(_HEAD_TOO_LARGE)
                self.transport.close()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head = True
            self._head_size = 0

        def on_url(self, url: bytes) -> None:
            super().on_url(url)
            self._head_size += len(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            super().on_header(name, value)
            self._head_size += len(name) + len(value) + 4

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._head_bytes = 0
            if self._head_size > self._limits.max_header_bytes:
                self.transport.write(_HEAD_TOO_LARGE)
                self.transport.close()
                return
            self._arm(self._limits.body_timeout)
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self.transport.is_closing():  # not after a refused head
                super().on_body(body)

        def on_message_complete(self) -> None:
            self._disarm()
            if not self.transport.is_closing():
                super().on_message_complete()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            # The next request's head is due within header_timeout (uvicorn's keep-alive
            # timeout, usually shorter, closes an idle connection first).
            if not self.transport.is_closing():
                self._arm(self._limits.header_timeout)

    return LimitedHttpToolsProtocol


__all__ = [
    "ConnectionLimits",
    "limited_protocol",
    "max_connections",
    "raise_open_files_limit",
]
