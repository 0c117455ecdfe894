"""A minimal HTTP/1.1 client for the benchmark's hot path.

aiohttp spends about 2 ms of CPU per streamed 64-token response on per-chunk bookkeeping
(reader objects, flow control, one event per HTTP chunk), which is as much as the server
being measured. This client is an asyncio `Protocol` that parses the response head and the
chunked body itself. A streaming consumer (`time_reads`) gets the body as it came, one
piece per network read stamped with the read's arrival time, and is woken once, at the
end; others read the body whole or piece by piece. It does only what the benchmark needs:
POST/GET with a body, keep-alive connections to one host, `Content-Length` or chunked
bodies. It is not a general-purpose client.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

_CRLF = -1  # chunked-body parser states (see `_Response._feed_body`)
_TRAILER = -2


_clock = time.perf_counter


def _whole_chunks(data: bytes, start: int, stop: int) -> bytes | None:
    """The data of the chunks that `data` holds if it is two or more whole chunks (none the
    last, empty one), the first's data at `data[start:stop]`; else None."""
    pieces = []
    n = len(data)
    while True:
        if data[stop : stop + 2] != b"\r\n":
            return None
        pieces.append(data[start:stop])
        pos = stop + 2
        if pos == n:
            return b"".join(pieces)
        end = data.find(b"\r\n", pos, pos + 10)
        if end < 0:
            return None
        digits = data[pos:end]
        try:
            size = int(digits, 16) if digits.isalnum() else 0
        except ValueError:
            return None
        start, stop = end + 2, end + 2 + size
        if size == 0 or stop + 2 > n:
            return None


class HttpError(Exception):
    """The connection failed or the response was malformed."""


class _Response(asyncio.Protocol):
    """One connection; one request at a time on it (HTTP/1.1 keep-alive)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._reset()
        self.closed = False

    def _reset(self) -> None:
        self._head = b""
        self.status = 0
        self.headers: dict[str, str] = {}
        self._head_done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._wake: asyncio.Future[None] | None = None
        self._body: list[bytes] = []
        self._arrived: float | None = None  # when the oldest unread body bytes came in
        self._chunked = False
        self._remaining = 0  # Content-Length bytes still to come, or of the current chunk
        self._raw = b""  # undecoded chunked framing
        self.finished = False
        self.keep_alive = True
        self._error: Exception | None = None
        self._timed = False  # see `time_reads`
        self._aligned = False  # timed, chunked, and the next read starts with a chunk
        self._reads: list[bytes] = []
        self._read_times: list[float] = []

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        now = _clock()
        if self._aligned:
            # The common case of a stream: the read is one whole chunk (a server writes
            # each event as one), or a few. Anything else takes the general path below.
            end = data.find(b"\r\n")
            if 0 < end <= 8:
                start = end + 2
                size = data[:end]
                try:  # (`int` alone would also take a sign, spaces or `_`)
                    stop = start + int(size, 16) if size.isalnum() else start
                except ValueError:
                    stop = start  # let the general path report it
                if stop > start and len(data) == stop + 2 and data[-2:] == b"\r\n":
                    self._reads.append(data[start:stop])
                    self._read_times.append(now)
                    return
                if stop > start and (body := _whole_chunks(data, start, stop)) is not None:
                    self._reads.append(body)
                    self._read_times.append(now)
                    return
        try:
            if not self._head_done.done():
                self._head += data
                end = self._head.find(b"\r\n\r\n")
                if end < 0:
                    return
                data = self._head[end + 4 :]
                self._parse_head(self._head[:end])
                self._head_done.set_result(None)
            if data:
                self._feed_body(data, now)
                if self._timed and self._body:
                    self._keep_read()
            self._realign()
        except (ValueError, HttpError) as exc:
            self._error = HttpError(f"malformed HTTP response: {exc}")
            if not self._head_done.done():
                self._head_done.set_exception(self._error)
            if self.transport is not None:
                self.transport.close()
        # Timed, the consumer only waits for the end: waking its task on every read would
        # cost a task step (through every awaiting frame) per network read.
        if not self._timed or self.finished or self._error is not None:
            self._signal()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.finished:
            self._error = HttpError(f"connection closed before the response ended ({exc})")
        if not self._head_done.done():
            self._head_done.set_exception(self._error or HttpError("connection closed"))
        self._signal()

    # -- parsing ---------------------------------------------------------------------

    def _parse_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/"):
            raise HttpError(f"not an HTTP response: {lines[0]!r}")
        self.status = int(parts[1])
        for line in lines[1:]:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()
        self._chunked = self.headers.get("transfer-encoding", "").lower() == "chunked"
        self.keep_alive = self.headers.get("connection", "").lower() != "close"
        if not self._chunked:
            self._remaining = int(self.headers.get("content-length", "0"))
            self.finished = self._remaining == 0

    def _feed_body(self, data: bytes, now: float) -> None:
        if self._arrived is None:
            self._arrived = now
        if not self._chunked:
            self._body.append(data)
            self._remaining -= len(data)
            self.finished = self._remaining <= 0
            return
        raw = self._raw + data if self._raw else data
        body, size, pos, n = self._body, self._remaining, 0, len(raw)
        # `size`: > 0 chunk bytes still to come; 0 a size line next; _CRLF the line end
        # after a chunk's data; _TRAILER the lines after the last chunk, to an empty one
        while pos < n:
            if size > 0:
                take = raw[pos : pos + size] if pos or n > size else raw
                body.append(take)
                size -= len(take)
                pos += len(take)
                if size:
                    break
                size = _CRLF
            if size == _CRLF:
                if n - pos < 2:
                    break
                pos += 2
                size = 0
            end = raw.find(b"\r\n", pos)
            if end < 0:
                break
            if size == _TRAILER:
                self.finished = end == pos  # the empty line that ends the response
                pos = end + 2
                if self.finished:
                    break
                continue
            digits = raw[pos:end].split(b";", 1)[0].strip()  # drops chunk extensions
            if not digits.isalnum():  # (what `int` would take besides hex digits)
                raise HttpError(f"bad chunk size {raw[pos:end]!r}")
            size = int(digits, 16)
            pos = end + 2
            if size == 0:
                size = _TRAILER
        self._remaining = size
        self._raw = raw[pos:] if pos < n else b""
        if not body and self._arrived == now:
            self._arrived = None

    def _signal(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _realign(self) -> None:
        self._aligned = self._timed and self._chunked and self._remaining == 0 and not self._raw

    def _keep_read(self) -> None:
        """The body bytes of the latest read as one piece, with its arrival time."""
        body = self._body
        self._reads.append(body[0] if len(body) == 1 else b"".join(body))
        self._read_times.append(_clock() if self._arrived is None else self._arrived)
        body.clear()
        self._arrived = None

    # -- consumer side ---------------------------------------------------------------

    def time_reads(self) -> None:
        """From now on keep the body as it came, one piece per network read with the time
        the read arrived (`timed_reads`), and wake `wait()` only at the end: the consumer
        parses the body once, not on every read, which would be most of a streaming
        client's cost."""
        self._timed = True
        if self._body:  # (what came with the head)
            self._keep_read()
        self._realign()

    def timed_reads(self) -> tuple[list[bytes], list[float]]:
        """The body so far, one piece per read, and when each read arrived."""
        return self._reads, self._read_times

    async def wait(self) -> None:
        """Until the whole body arrived (raises if the connection broke first)."""
        while not self.finished:
            if self._error is not None:
                raise self._error
            self._wake = asyncio.get_running_loop().create_future()
            await self._wake
            self._wake = None

    async def head(self) -> None:
        await self._head_done

    async def chunks(self) -> AsyncIterator[tuple[float, bytes]]:
        """(arrival time, bytes) of everything received since the last step, to the end."""
        while True:
            if self._body:
                data = b"".join(self._body)
                arrived = _clock() if self._arrived is None else self._arrived
                self._body.clear()
                self._arrived = None
                yield arrived, data
                continue
            if self.finished:
                return
            if self._error is not None:
                raise self._error
            self._wake = asyncio.get_running_loop().create_future()
            await self._wake
            self._wake = None

    async def read(self) -> bytes:
        return b"".join([data async for _, data in self.chunks()])


class HttpClient:
    """Keep-alive connections to one base URL; `request` borrows an idle one or opens one."""

    def __init__(
        self, base_url: str, timeout: float = 600.0, headers: dict[str, str] | None = None
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http":
            raise ValueError(f"only http:// URLs are supported, got {base_url!r}")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.timeout = timeout
        # Extra header lines of every request (e.g. Authorization), pre-rendered once.
        self._extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._idle: list[_Response] = []

    async def _connection(self) -> _Response:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                conn._reset()
                return conn
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(_Response, self.host, self.port)
        except OSError as exc:
            raise HttpError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        return conn

    async def request(
        self, method: str, path: str, body: bytes = b"", head_timeout: bool = True
    ) -> _Response:
        """Send a request; returns once the response head arrived (read the body from the
        returned object, then call `release`). `head_timeout=False` when the caller holds
        its own time limit over the whole exchange (one timer per request, not two)."""
        head = (
            f"{method} {self.prefix}{path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{self._extra}\r\n"
        ).encode("latin-1")
        for attempt in range(2):
            reused = attempt == 0 and any(not c.closed for c in self._idle)
            conn = await self._connection()
            assert conn.transport is not None
            conn.transport.write(head + body)
            try:
                if not head_timeout:
                    await conn.head()
                    return conn
                async with asyncio.timeout(self.timeout):  # (no task per request)
                    await conn.head()
                return conn
            except HttpError:
                # A kept-alive connection the server closed (its keep-alive timeout) just
                # as the request went out: nothing of a response came, so the server never
                # read it. Retry on a fresh connection, as HTTP clients do; only then fail.
                if not (reused and conn.closed and not conn._head):
                    raise
        raise AssertionError("unreachable")

    def release(self, conn: _Response) -> None:
        """Give the connection back when its response was read whole."""
        if conn.finished and conn.keep_alive and not conn.closed:
            self._idle.append(conn)
        elif conn.transport is not None:
            conn.transport.close()

    def close(self) -> None:
        for conn in self._idle:
            if conn.transport is not None:
                conn.transport.close()
        self._idle.clear()
