"""`KvTransferAgent`: one engine's end of KV transfer, both roles.

Prefill side (`serve`): a TCP server on `config.host` that answers `acquire` (are these
blocks still pinned?), `read` (their bytes, for the TCP transport) and `release` (unpin);
the agent's `describe()` goes into every `DisaggParams.transfer`: the server's address, the
pool's layout, this process (pid, host) and, for a CUDA pool, its CUDA IPC handle.

Decode side (`pull`, `release`): picks the transport per transfer, unless the config
forces one:

- `local`: the prefill agent lives in this process (`stator run --disagg`): pool to pool;
- `ipc`: same host and both pools on CUDA: the prefill pool is opened through CUDA IPC
  once (mapped in this GPU's context for the `pull` copy, the default, else on the GPU
  that holds it), then blocks are copied GPU to GPU (`copy.copy_blocks`);
- `nixl` (`nixl.py`): other hosts, when both sides have the `nixl` package: the decode
  side's NIXL agent reads the blocks straight from the prefill pool (RDMA where UCX has it);
  the prefill side's agent is made, and its pool registered, on the first `nixl` request;
- `tcp` (`tcp.py`): anything else: the bytes come over the socket in chunks, straight
  into the pool.

`auto` falls back from ipc or nixl to tcp when opening the handle or loading the peer
fails. Whatever the transport, the pin is checked for every pull (`acquire` or `read`), so
a pull never keeps blocks the prefill side has since reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import torch

from stator.kv.transfer import ipc, nixl, tcp, wire
from stator.kv.transfer.config import TransferConfig
from stator.kv.transfer.copy import AUTO_GPU_METHOD, copy_blocks
from stator.kv.transfer.peer import host_id, layout
from stator.kv.transfer.result import PullResult, TransferError

log = logging.getLogger(__name__)

# Pin id -> the block ids pinned under it (None: nothing pinned).
PinLookup = Callable[[str], "list[int] | None"]
Release = Callable[[str], Awaitable[bool]]
# An extra operation of the server: the message in, the answer out.
Operation = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]

_agents: weakref.WeakValueDictionary[str, KvTransferAgent] = weakref.WeakValueDictionary()


@dataclass
class _Link:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    lock: asyncio.Lock  # one exchange at a time on a connection


class KvTransferAgent:
    def __init__(
        self,
        config: TransferConfig,
        pool: torch.Tensor,
        *,
        pins: PinLookup | None = None,
        release: Release | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self.pool = pool
        self.pins = pins
        self.on_release = release
        self.id = uuid.uuid4().hex
        self.server: asyncio.base_events.Server | None = None
        self.address: str | None = None
        self._ipc_handle: bytes | None = None
        self._opened: dict[str, torch.Tensor] = {}  # remote agent id -> its pool
        self._links: dict[str, _Link] = {}  # prefill server address -> open connection
        self._clients: set[asyncio.StreamWriter] = set()  # decode agents connected here
        self._stream = torch.cuda.Stream(pool.device) if pool.is_cuda else None
        self._nixl: nixl.NixlEndpoint | None = None  # made on first use
        self._copy_seconds = 0.0
        self._phases: dict[str, float] = {}
        self._copy_done = 0.0
        self.ops: dict[str, Operation] = {}  # served beside acquire / read / release / nixl
        _agents[self.id] = self

    # -- prefill side --------------------------------------------------------------

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
                    released = self.on_release is not None and await self.on_release(pin)
                    await wire.send(writer, {"ok": True, "released": released})
                    continue
                if op == "nixl":  # a decode agent's first NIXL pull from here
                    await wire.send(writer, await self._nixl_metadata())
                    continue
                blocks = [int(b) for b in message.get("blocks", [])]
                problem = self._check(pin, blocks)
                if problem is not None:
                    await wire.send(writer, {"ok": False, "error": problem})
                elif op == "acquire":
                    await wire.send(writer, {"ok": True})
                elif op == "read":
                    await tcp.send_blocks(self.pool, writer, blocks)
                else:
                    await wire.send(writer, {"ok": False, "error": f"unknown op {op!r}"})
        except Exception:
            log.exception("KV transfer connection failed")
        finally:
            self._clients.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

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

    # -- decode side ---------------------------------------------------------------

    def choose(self, transfer: dict[str, Any]) -> str:
        kind = self.config.kind
        if kind != "auto":
            return kind
        if transfer.get("pid") == os.getpid() and transfer.get("agent") in _agents:
            return "local"
        same_host = transfer.get("host") == host_id()
        if same_host and "ipc" in transfer and self.pool.is_cuda:
            return "ipc"
        if not same_host and "nixl" in transfer and nixl.available():
            return "nixl"
        return "tcp"

    async def pull(
        self, transfer: dict[str, Any], pin: str, remote: list[int], local: list[int]
    ) -> PullResult:
        """Copy the pinned remote blocks into `local`; raises TransferError."""
        if transfer.get("layout") != layout(self.pool):
            raise TransferError(
                f"KV layouts differ: remote {transfer.get('layout')} vs local {layout(self.pool)}"
            )
        kind = self.choose(transfer)
        started = time.perf_counter()
        self._copy_seconds = 0.0
        self._phases = {}
        try:
            if kind == "local":
                moved = await self._pull_local(transfer, pin, remote, local)
            elif kind in ("ipc", "nixl"):
                pull = self._pull_ipc if kind == "ipc" else self._pull_nixl
                try:
                    moved = await pull(transfer, pin, remote, local)
                except TransferError:
                    raise
                except Exception as exc:
                    if self.config.kind != "auto":
                        raise TransferError(f"{kind} pull failed: {exc}") from exc
                    log.warning("%s pull failed (%s); falling back to TCP", kind, exc)
                    kind = "tcp"
                    moved = await self._pull_tcp(transfer, pin, remote, local)
            elif kind == "tcp":
                moved = await self._pull_tcp(transfer, pin, remote, local)
            else:
                raise TransferError(f"unknown KV transfer kind {kind!r}")
        except TransferError:
            raise
        except tcp.TcpRefused as exc:
            raise TransferError(str(exc)) from exc
        except (OSError, asyncio.IncompleteReadError, ConnectionError) as exc:
            raise TransferError(f"{kind} pull failed: {type(exc).__name__}: {exc}") from exc
        seconds = time.perf_counter() - started
        copy = self._copy_seconds or seconds
        return PullResult(kind, moved, len(remote), seconds, copy, self._phases)

    async def _pull_local(self, transfer, pin, remote, local) -> int:
        source = _agents.get(transfer.get("agent", ""))
        if source is None:
            raise TransferError("the prefill agent is not in this process")
        problem = source._check(pin, remote)
        if problem is not None:
            raise TransferError(problem)
        return await asyncio.to_thread(self._copy_from, source.pool, remote, local)

    async def _pull_ipc(self, transfer, pin, remote, local) -> int:
        agent = transfer["agent"]
        src = self._opened.get(agent)
        if src is None:
            # A pull kernel runs on this GPU: the pool must be mapped in its context.
            method = AUTO_GPU_METHOD if self.config.copy == "auto" else self.config.copy
            here = method == "pull"
            src = self._opened[agent] = ipc.open_pool(transfer["ipc"], self.pool.device, here)
        # The pin check's round trip overlaps the copy. It runs while the copy does, so a
        # "pinned" answer means the blocks were pinned while they were read: a pin lasts
        # until this side releases it (or a timeout of tens of seconds), never a gap.
        check = asyncio.ensure_future(
            self._request(transfer, {"op": "acquire", "pin": pin, "blocks": remote})
        )
        called = time.perf_counter()
        try:
            moved = await asyncio.to_thread(self._copy_from, src, remote, local, called)
        finally:
            returned = time.perf_counter()
            await asyncio.wait({check})
            self._phases["hop_back"] = returned - self._copy_done
            self._phases["check_wait"] = time.perf_counter() - returned
        check.result()  # raises TransferError when they were not pinned: data discarded
        return moved

    def _copy_from(
        self, src: torch.Tensor, remote: list[int], local: list[int], called: float = 0.0
    ) -> int:
        started = time.perf_counter()
        if called:
            self._phases["hop"] = started - called
        if self._stream is None:
            moved = copy_blocks(src, self.pool, remote, local, self.config.copy)
        else:
            begin = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            with torch.cuda.device(self.pool.device), torch.cuda.stream(self._stream):
                begin.record()
                moved = copy_blocks(src, self.pool, remote, local, self.config.copy)
                end.record()
            self._phases["launch"] = time.perf_counter() - started
            self._stream.synchronize()
            self._phases["device"] = begin.elapsed_time(end) / 1e3
        self._copy_done = time.perf_counter()
        self._copy_seconds += self._copy_done - started
        return moved

    async def _pull_nixl(self, transfer, pin, remote, local) -> int:
        peer, info = str(transfer["agent"]), transfer["nixl"]
        endpoint = self._nixl_endpoint()
        if not endpoint.has_peer(peer):
            try:
                answer = await self._request(transfer, {"op": "nixl", "pin": pin})
            except TransferError as exc:  # its NIXL agent failed: not a pin problem
                raise nixl.NixlError(str(exc)) from exc
            await asyncio.to_thread(endpoint.add_peer, peer, answer["metadata"], info)
        # As for IPC: the pin check runs while the bytes move; "not pinned" discards them.
        check = asyncio.ensure_future(
            self._request(transfer, {"op": "acquire", "pin": pin, "blocks": remote})
        )
        started = time.perf_counter()
        try:
            try:
                moved = await asyncio.to_thread(
                    endpoint.read, peer, int(info["blocks"]), remote, local, self.config.timeout
                )
            finally:
                await asyncio.wait({check})
            self._copy_seconds += time.perf_counter() - started
            check.result()
        except TransferError:  # not pinned: the peer is fine
            raise
        except BaseException:
            if check.done() and not check.cancelled():
                check.exception()  # retrieved: the read's own error is the one raised
            endpoint.drop_peer(peer)  # dead or restarted: loaded afresh next time
            raise
        return moved

    async def _pull_tcp(self, transfer, pin, remote, local) -> int:
        started = time.perf_counter()
        address = str(transfer.get("address"))
        moved = await tcp.pull(self.pool, self._stream, address, pin, remote, local)
        self._copy_seconds += time.perf_counter() - started
        return moved

    async def release(self, transfer: dict[str, Any], pin: str) -> None:
        """Tell the prefill side it may unpin (best effort: its timeout is the backstop)."""
        try:
            source = _agents.get(transfer.get("agent", ""))
            if source is not None and source.on_release is not None:
                await source.on_release(pin)
                return
            await asyncio.wait_for(self._request(transfer, {"op": "release", "pin": pin}), 5.0)
        except Exception as exc:
            log.debug("KV release of %s failed: %s", pin, exc)

    async def _request(self, transfer: dict[str, Any], message: dict[str, Any]) -> dict:
        """One round trip to the prefill side's server, on a connection kept per server:
        a fresh connection per pull cost a few hundred microseconds of a 1k-token pull
        that moves its bytes in ~0.4 ms."""
        address = str(transfer.get("address"))
        link = self._links.get(address)
        if link is not None:
            try:
                return await self._exchange(address, link, message)
            except (OSError, asyncio.IncompleteReadError, ConnectionError):
                pass  # the server restarted or dropped it: once more on a new connection
        return await self._exchange(address, await self._connect(address), message)

    async def _connect(self, address: str) -> _Link:
        host, _, port = address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        current = self._links.get(address)
        if current is not None and not current.writer.is_closing():
            writer.close()  # another pull connected meanwhile: share its connection
            return current
        link = self._links[address] = _Link(reader, writer, asyncio.Lock())
        return link

    async def _exchange(self, address: str, link: _Link, message: dict[str, Any]) -> dict:
        async with link.lock:
            try:
                await wire.send(link.writer, message)
                answer = await wire.receive(link.reader)
            except BaseException:
                # Cut mid-exchange (an error, a cancel): its answer may still come, so the
                # connection can never be reused.
                if self._links.get(address) is link:
                    del self._links[address]
                link.writer.close()
                raise
        if not answer.get("ok"):
            raise TransferError(str(answer.get("error")))
        return answer

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            for client in list(self._clients):
                client.close()
            with contextlib.suppress(Exception):
                await self.server.wait_closed()
            self.server = None
        for link in self._links.values():
            link.writer.close()
        self._links.clear()
        self._opened.clear()
        if self._nixl is not None:
            self._nixl.close()
            self._nixl = None
        _agents.pop(self.id, None)
