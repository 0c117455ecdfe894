"""The prefill side of a `KvTransferAgent` (mixed into it): a TCP server on `config.host`
that answers `acquire` (are these blocks still pinned?), `read` (their bytes, for the TCP
transport), `release` (unpin) and `nixl` (its NIXL agent's metadata), plus any extra
`ops`; and `describe()`, which goes into every `DisaggParams.transfer`: the server's
address, the pool's layout, this process (pid, host) and, for a CUDA pool, its CUDA IPC
handle."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

import torch

from stator.kv.transfer import ipc, nixl, tcp, wire
from stator.kv.transfer.config import TransferConfig
from stator.kv.transfer.peer import host_id, layout

log = logging.getLogger("stator.kv.transfer.agent")

# Pin id -> the block ids pinned under it (None: nothing pinned).
PinLookup = Callable[[str], "list[int] | None"]
Release = Callable[[str], Awaitable[bool]]
# A decode agent checked the pin before reading its blocks: only that agent may unpin it
# now (`release_kv(..., unless_claimed=True)` leaves it pinned), after its copy ended.
Claim = Callable[[str], None]
# An extra operation of the server: the message in, the answer out.
Operation = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class ServeSide:
    config: TransferConfig
    pool: torch.Tensor
    id: str
    pins: PinLookup | None
    on_release: Release | None
    on_claim: Claim | None
    ops: dict[str, Operation]
    server: asyncio.base_events.Server | None
    address: str | None
    _ipc_handle: bytes | None
    _clients: set[asyncio.StreamWriter]
    _nixl: nixl.NixlEndpoint | None

    async def serve(self) -> None:
        """Start answering decode agents (prefill role). Without `pins` (a tensor-parallel
        rank > 0, whose pins rank 0 holds and checks), every block is served unchecked."""
        self.server = await asyncio.start_server(self._handle, self.config.host, 0)
        port = self.server.sockets[0].getsockname()[1]
        self.address = f"{self.config.host}:{port}"
        if self.pool.is_cuda and self.config.kind in ("auto", "ipc"):
            try:
                self._ipc_handle = ipc.export_pool(self.pool)
            except Exception as exc:  # e.g. a build without CUDA IPC
                log.warning("KV pool not shareable through CUDA IPC (%s); TCP only", exc)
        log.info("KV transfer server at %s (%s)", self.address, self.config.kind)

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "agent": self.id,
            "kind": self.config.kind,
            "address": self.address,
            "pid": os.getpid(),
            "host": host_id(),
            "layout": layout(self.pool),
        }
        if self._ipc_handle is not None:
            info["ipc"] = self._ipc_handle
        if self.config.kind in ("auto", "nixl") and nixl.available():
            info["nixl"] = nixl.region(self.pool)
        return info

    def _nixl_endpoint(self) -> nixl.NixlEndpoint:
        if self._nixl is None:
            self._nixl = nixl.NixlEndpoint(f"stator-{self.id}", self.pool)
        return self._nixl

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Decode agents keep their connection open between pulls; `close` cuts them (on
        # Python >= 3.12 the server's wait_closed waits for every connection).
        self._clients.add(writer)
        try:
            while True:
                try:
                    message = await wire.receive(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                op, pin = message.get("op"), str(message.get("pin"))
                if op in self.ops:
                    await wire.send(writer, await self.ops[op](message))
                    continue
                if op == "release":
                    # `pins`: a decode agent's releases pending together (coalesced.py).
                    pins = [str(p) for p in message.get("pins") or [pin]]
                    released = [
                        self.on_release is not None and await self.on_release(p) for p in pins
                    ]
                    answer = released if "pins" in message else released[0]
                    await wire.send(writer, {"ok": True, "released": answer})
                    continue
                if op == "acquire" and "pins" in message:  # checks pending together
                    problems = [
                        self._claim(str(p), [int(b) for b in blocks])
                        for p, blocks in message["pins"]
                    ]
                    await wire.send(writer, {"ok": True, "problems": problems})
                    continue
                if op == "nixl":  # a decode agent's first NIXL pull from here
                    await wire.send(writer, await self._nixl_metadata())
                    continue
                blocks = [int(b) for b in message.get("blocks", [])]
                problem = self._claim(pin, blocks)
                if problem is not None:
                    await wire.send(writer, {"ok": False, "error": problem})
                elif op == "acquire":
                    await wire.send(writer, {"ok": True})
                elif op == "read":
                    recheck = functools.partial(self._check, pin, blocks)
                    await tcp.send_blocks(self.pool, writer, blocks, recheck)
                else:
                    await wire.send(writer, {"ok": False, "error": f"unknown op {op!r}"})
        except Exception:
            log.exception("KV transfer connection failed")
        finally:
            self._clients.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _claim(self, pin: str, blocks: list[int]) -> str | None:
        """`_check`, and when the blocks are pinned, mark the pin as this reader's."""
        problem = self._check(pin, blocks)
        if problem is None and self.on_claim is not None:
            self.on_claim(pin)
        return problem

    def _check(self, pin: str, blocks: list[int]) -> str | None:
        if self.pins is None:
            return None
        pinned = self.pins(pin)
        if pinned is None:
            return f"nothing pinned under {pin!r} (released or expired)"
        if not set(blocks) <= set(pinned):
            return f"blocks not pinned under {pin!r}"
        return None

    async def _nixl_metadata(self) -> dict[str, Any]:
        if self.config.kind not in ("auto", "nixl") or not nixl.available():
            return {"ok": False, "error": "this prefill worker does not serve NIXL"}
        try:
            metadata = await asyncio.to_thread(self._nixl_endpoint().metadata)
        except Exception as exc:
            log.warning("NIXL agent not available (%s)", exc)
            return {"ok": False, "error": f"NIXL: {type(exc).__name__}: {exc}"}
        return {"ok": True, "metadata": metadata}
