"""The KV transfer server's wire format: a length-prefixed msgpack message each way,
then, for a `read`, the blocks' raw bytes (block-major, chunk after chunk) and a last
message saying whether they stayed pinned while read.

    caller -> server   {"op": "acquire" | "read" | "release", "pin": id, "blocks": [...]}
    server -> caller   {"ok": bool, "error": str?, "chunks": [bytes per chunk]?}
    (read, after the chunks)   {"ok": bool, "error": str?}
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import msgspec

_LEN = struct.Struct(">I")
MAX_MESSAGE = 16 << 20


async def send(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    body = msgspec.msgpack.encode(message)
    writer.write(_LEN.pack(len(body)) + body)
    await writer.drain()


async def receive(reader: asyncio.StreamReader) -> dict[str, Any]:
    (size,) = _LEN.unpack(await reader.readexactly(_LEN.size))
    if size > MAX_MESSAGE:
        raise ConnectionError(f"KV transfer message of {size} bytes")
    message = msgspec.msgpack.decode(await reader.readexactly(size))
    if not isinstance(message, dict):
        raise ConnectionError("malformed KV transfer message")
    return message
