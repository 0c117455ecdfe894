"""The TCP transport: the prefill side's server sends the pinned blocks' bytes over the
socket in chunks, block-major, then whether they stayed pinned; the decode side scatters
each chunk straight into its pool (no per-block Python objects). For any two processes, CPU or GPU, across hosts without
RDMA (or without NIXL)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import torch

from stator.kv.block_copy import block_bytes, gather, scatter
from stator.kv.transfer import wire

# Bytes per chunk: big enough to amortize the per-chunk work, small enough to overlap
# reading the socket with scattering the previous chunk.
TCP_CHUNK_BYTES = 16 << 20


class TcpRefused(Exception):
    """The prefill side refused the read (its message says why)."""


async def send_blocks(
    pool: torch.Tensor,
    writer: asyncio.StreamWriter,
    blocks: list[int],
    unpinned: Callable[[], str | None],
) -> None:
    """Prefill side: the header (bytes per chunk), the chunks, then whether the blocks
    are still pinned (`unpinned()`: None, or why not). Pinned after the last chunk was
    read means pinned while every chunk was (a pin never comes back once gone); a pin
    that ran out mid-read (its timeout, on a slow link) may have had its blocks reused,
    so the decode side then discards what it received."""
    size = block_bytes(pool)
    per_chunk = max(1, TCP_CHUNK_BYTES // size)
    chunks = [blocks[i : i + per_chunk] for i in range(0, len(blocks), per_chunk)]
    await wire.send(writer, {"ok": True, "chunks": [len(c) * size for c in chunks]})
    for ids in chunks:
        data = await asyncio.to_thread(_host_bytes, pool, ids)
        writer.write(data)
        await writer.drain()
    problem = unpinned()
    await wire.send(writer, {"ok": problem is None, "error": problem})


def _host_bytes(pool: torch.Tensor, ids: list[int]) -> memoryview:
    data = gather(pool, ids).contiguous()
    if data.is_cuda:
        data = data.cpu()
    return memoryview(data.view(torch.uint8).numpy()).cast("B")


async def pull(
    pool: torch.Tensor,
    stream: torch.cuda.Stream | None,
    address: str,
    pin: str,
    remote: list[int],
    local: list[int],
    timeout: float,
) -> int:
    """Decode side: read blocks `remote` from the server at `address` into `local`; returns
    the bytes moved. Raises TcpRefused, OSError (TimeoutError: the server went quiet for
    `timeout` seconds), asyncio.IncompleteReadError. Only the socket waits time out: a
    scatter in flight is never abandoned (it writes blocks the caller frees on failure)."""
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout)
    try:
        await wire.send(writer, {"op": "read", "pin": pin, "blocks": remote})
        header = await asyncio.wait_for(wire.receive(reader), timeout)
        if not header.get("ok"):
            raise TcpRefused(str(header.get("error")))
        size = block_bytes(pool)
        shape = (-1, *pool.movedim(2, 0).shape[1:])
        done = 0
        for nbytes in header["chunks"]:
            data = await asyncio.wait_for(reader.readexactly(int(nbytes)), timeout)
            n = int(nbytes) // size
            rows = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            rows = rows.view(pool.dtype).view(shape)
            await asyncio.to_thread(_scatter, pool, stream, local[done : done + n], rows)
            done += n
        trailer = await asyncio.wait_for(wire.receive(reader), timeout)
        if not trailer.get("ok"):
            raise TcpRefused(f"unpinned while read: {trailer.get('error')}")
        return done * size
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def _scatter(
    pool: torch.Tensor, stream: torch.cuda.Stream | None, local: list[int], rows: torch.Tensor
) -> None:
    if stream is None:
        scatter(pool, local, rows)
        return
    with torch.cuda.device(pool.device), torch.cuda.stream(stream):
        scatter(pool, local, rows.pin_memory())
    stream.synchronize()
