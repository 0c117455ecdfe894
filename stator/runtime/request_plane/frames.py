"""The TCP request plane's wire format: length-prefixed msgpack frames.

Each frame is a 4-byte big-endian length followed by a msgpack array whose first element
is the frame kind. Frames are encoded from plain tuples (one msgspec pass, no
intermediate objects) and decoded into tagged array-like Structs; payloads stay
`msgspec.Raw` until the endpoint's request or response type is known.

    REQUEST  [1, stream_id, endpoint, payload]   caller -> server
    ITEM     [2, stream_id, payload]             server -> caller, one response
    END      [3, stream_id]                      server -> caller, stream finished
    ERROR    [4, stream_id, code, message]       server -> caller, stream failed
    CANCEL   [5, stream_id]                      caller -> server, caller closed the stream
    PING     [6]                                 either way, keeps a quiet connection alive
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

REQUEST, ITEM, END, ERROR, CANCEL, PING = 1, 2, 3, 4, 5, 6

# ERROR codes: how the caller should classify the failure.
ERR_HANDLER = 0  # the handler raised -> RemoteError
ERR_NOT_FOUND = 1  # endpoint not served here -> EndpointNotFound
ERR_SHUTDOWN = 2  # endpoint was served but is draining -> EngineShutdown (migratable)
ERR_BAD_REQUEST = 3  # request payload did not decode -> RemoteError

# A frame larger than this is a protocol error (a corrupt length, or an abusive peer).
MAX_FRAME = 256 * 1024 * 1024
_HEADER = 4


class Request(msgspec.Struct, array_like=True, tag=REQUEST):
    stream_id: int
    endpoint: str
    payload: msgspec.Raw


class Item(msgspec.Struct, array_like=True, tag=ITEM):
    stream_id: int
    payload: msgspec.Raw


class End(msgspec.Struct, array_like=True, tag=END):
    stream_id: int


class Error(msgspec.Struct, array_like=True, tag=ERROR):
    stream_id: int
    code: int
    message: str


class Cancel(msgspec.Struct, array_like=True, tag=CANCEL):
    stream_id: int


class Ping(msgspec.Struct, array_like=True, tag=PING):
    pass


Frame = Request | Item | End | Error | Cancel | Ping

_frame_decoder = msgspec.msgpack.Decoder(Frame)


class ProtocolError(Exception):
    """The peer sent bytes that are not a valid frame stream."""


class FrameWriter:
    """Appends frames to one growing buffer; the owner hands the buffer to the socket
    once per event-loop turn, so many small frames cost one write."""

    __slots__ = ("_encoder", "buffer")

    def __init__(self) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self.buffer = bytearray()

    def add(self, frame: tuple[Any, ...]) -> None:
        buf = self.buffer
        start = len(buf)
        buf += b"\0\0\0\0"
        try:
            self._encoder.encode_into(frame, buf, start + _HEADER)
        except Exception:
            del buf[start:]  # leave no half-written frame behind
            raise
        buf[start : start + _HEADER] = (len(buf) - start - _HEADER).to_bytes(_HEADER, "big")

    def take(self) -> bytearray:
        """The pending bytes; the writer starts a fresh buffer (ownership passes to the
        caller, so the transport may keep a reference without a copy)."""
        out = self.buffer
        self.buffer = bytearray()
        return out


class FrameReader:
    """Splits a byte stream into decoded frames. Whole frames inside one received chunk
    are decoded straight from it; only a frame cut across chunks is buffered."""

    __slots__ = ("_need", "_partial", "on_frame")

    def __init__(self, on_frame: Callable[[Frame], None]) -> None:
        self.on_frame = on_frame
        self._partial = bytearray()
        self._need = _HEADER  # bytes the partial frame needs before it can be parsed

    def feed(self, data: bytes) -> None:
        if self._partial:
            self._partial += data
            if len(self._partial) < self._need:
                return
            data = bytes(self._partial)
            self._partial = bytearray()
        view = memoryview(data)
        size = len(data)
        pos = 0
        on_frame = self.on_frame
        while size - pos >= _HEADER:
            length = int.from_bytes(view[pos : pos + _HEADER], "big")
            if length > MAX_FRAME:
                raise ProtocolError(f"frame of {length} bytes exceeds the {MAX_FRAME} limit")
            end = pos + _HEADER + length
            if end > size:
                self._need = end - pos
                break
            try:
                frame = _frame_decoder.decode(view[pos + _HEADER : end])
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise ProtocolError(f"undecodable frame: {exc}") from exc
            pos = end
            on_frame(frame)
        else:
            self._need = _HEADER
        if pos < size:
            self._partial = bytearray(view[pos:])
