"""The decode side of a `KvTransferAgent` (mixed into it): `pull` picks the transport per
transfer, unless the config forces one:

- `local`: the prefill agent lives in this process (`stator run --disagg`): pool to pool;
- `ipc`: same host and both pools on CUDA: the prefill pool is opened through CUDA IPC
  once (mapped in this GPU's context for the `pull` copy, the default, else on the GPU
  that holds it), then blocks are copied GPU to GPU: with the `pull` kernel by a
  `PeerCopier` (enqueued from the event loop, waited for in a thread; pulls pending
  together share one launch, `coalesced.py`), else by `copy.copy_blocks` in a thread;
- `nixl` (`nixl.py`): other hosts, when both sides have the `nixl` package: the decode
  side's NIXL agent reads the blocks straight from the prefill pool (RDMA where UCX has it);
- `tcp` (`tcp.py`): anything else: the bytes come over the socket in chunks, straight
  into the pool.

`auto` falls back from ipc or nixl to tcp when opening the handle or loading the peer
fails. Whatever the transport, the pin is checked for every pull (`acquire` or `read`),
so a pull never keeps blocks the prefill side has since reused; `release` unpins after.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from stator.kv.transfer import ipc, nixl, tcp
from stator.kv.transfer.batching import Batcher, wait_out
from stator.kv.transfer.coalesced import (
    LaunchFailed,
    check_batcher,
    copy_batcher,
    release_batcher,
)
from stator.kv.transfer.config import TransferConfig
from stator.kv.transfer.copy import AUTO_GPU_METHOD, copy_blocks
from stator.kv.transfer.peer import host_id, layout
from stator.kv.transfer.result import PullResult, TransferError

if TYPE_CHECKING:
    from stator.kv.transfer.agent import KvTransferAgent
    from stator.kv.transfer.peer_copier import PeerCopier

log = logging.getLogger("stator.kv.transfer.agent")

# Every agent of this process by id: a `local` pull reads its prefill agent's pool.
local_agents: weakref.WeakValueDictionary[str, KvTransferAgent] = weakref.WeakValueDictionary()


@dataclass
class PullTimes:
    """One pull's timings (`PullResult.copy_seconds` and `phases`)."""

    copy_seconds: float = 0.0
    copy_done: float = 0.0  # when the copy thread finished (for `hop_back`)
    batched: int = 1  # pulls in this pull's copy batch (coalesced.py)
    phases: dict[str, float] = field(default_factory=dict)


class PullSide:
    config: TransferConfig
    pool: torch.Tensor
    _opened: dict[str, torch.Tensor]  # remote agent id -> its pool
    _copiers: dict[str, PeerCopier | None]  # remote agent id -> its copier (None: none)
    _stream: torch.cuda.Stream | None
    _nixl: nixl.NixlEndpoint | None
    # ("copy", prefill agent id) / ("check" | "release", prefill server address) -> its
    # batcher (coalesced.py)
    _batchers: dict[tuple[str, str], Batcher]

    if TYPE_CHECKING:  # the other parts of the agent (serving.py, links.py)

        def _check(self, pin: str, blocks: list[int]) -> str | None: ...
        def _nixl_endpoint(self) -> nixl.NixlEndpoint: ...
        async def _request(self, transfer: dict[str, Any], message: dict[str, Any]) -> dict: ...

    def choose(self, transfer: dict[str, Any]) -> str:
        kind = self.config.kind
        if kind != "auto":
            return kind
        if transfer.get("pid") == os.getpid() and transfer.get("agent") in local_agents:
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
        times = PullTimes()  # this pull's own: pulls run concurrently
        try:
            if kind == "local":
                moved = await self._pull_local(transfer, pin, remote, local, times)
            elif kind in ("ipc", "nixl"):
                pull = self._pull_ipc if kind == "ipc" else self._pull_nixl
                try:
                    moved = await pull(transfer, pin, remote, local, times)
                except TransferError:
                    raise
                except Exception as exc:
                    if self.config.kind != "auto":
                        raise TransferError(f"{kind} pull failed: {exc}") from exc
                    log.warning("%s pull failed (%s); falling back to TCP", kind, exc)
                    kind = "tcp"
                    moved = await self._pull_tcp(transfer, pin, remote, local, times)
            elif kind == "tcp":
                moved = await self._pull_tcp(transfer, pin, remote, local, times)
            else:
                raise TransferError(f"unknown KV transfer kind {kind!r}")
        except TransferError:
            raise
        except tcp.TcpRefused as exc:
            raise TransferError(str(exc)) from exc
        except (OSError, asyncio.IncompleteReadError, ConnectionError) as exc:
            raise TransferError(f"{kind} pull failed: {type(exc).__name__}: {exc}") from exc
        seconds = time.perf_counter() - started
        copy = times.copy_seconds or seconds
        return PullResult(kind, moved, len(remote), seconds, copy, times.phases, times.batched)

    async def _pull_local(self, transfer, pin, remote, local, times: PullTimes) -> int:
        source = local_agents.get(transfer.get("agent", ""))
        if source is None:
            raise TransferError("the prefill agent is not in this process")
        problem = source._claim(pin, remote)
        if problem is not None:
            raise TransferError(problem)
        return await run_out(self._copy_from, source.pool, remote, local, times)

    def _copy_method(self) -> str:
        return AUTO_GPU_METHOD if self.config.copy == "auto" else self.config.copy

    def _peer_copier(self, agent: str, src: torch.Tensor) -> PeerCopier | None:
        if agent not in self._copiers:
            copier = None
            if self._copy_method() == "pull" and self._stream is not None:
                try:
                    from stator.kv.transfer.peer_copier import PeerCopier

                    copier = PeerCopier(src, self.pool, self._stream)
                except Exception as exc:  # no Triton, a kernel that cannot run here
                    log.warning("KV peer copier not available (%s); copying by copy_blocks", exc)
            self._copiers[agent] = copier
        return self._copiers[agent]

    async def _pull_ipc(self, transfer, pin, remote, local, times: PullTimes) -> int:
        agent = transfer["agent"]
        src = self._opened.get(agent)
        if src is None:
            # A pull kernel runs on this GPU: the pool must be mapped in its context.
            here = self._copy_method() == "pull"
            src = self._opened[agent] = ipc.open_pool(transfer["ipc"], self.pool.device, here)
        # The pin check's round trip overlaps the copy. It runs while the copy does, so a
        # "pinned" answer means the blocks were pinned while they were read: a pin lasts
        # until this side releases it (or a timeout of tens of seconds), never a gap.
        check = asyncio.ensure_future(self._checked(transfer, pin, remote))
        try:
            copier = self._peer_copier(agent, src)
            moved = None
            if copier is not None:
                moved = await self._copy_by(agent, copier, src, remote, local, times)
            if moved is None:
                called = time.perf_counter()
                moved = await run_out(self._copy_from, src, remote, local, times, called)
                times.phases["hop_back"] = time.perf_counter() - times.copy_done
        finally:
            returned = time.perf_counter()
            await asyncio.wait({check})
            times.phases["check_wait"] = time.perf_counter() - returned
        check.result()  # raises TransferError when they were not pinned: data discarded
        return moved

    async def _copy_by(
        self, agent: str, copier: PeerCopier, src, remote, local, times: PullTimes
    ) -> int | None:
        """Through the pool's copy batcher: enqueued on this (the event loop's) thread with
        the other pulls pending, waited for in a worker thread. None: the launch failed
        (then copy_blocks copies, for this pull and every later one)."""
        key = ("copy", agent)
        batcher = self._batcher(key, lambda: copy_batcher(copier, self.config.coalesce))
        started = time.perf_counter()
        try:
            phases, batch = await batcher.submit((remote, local))
        except LaunchFailed as exc:
            log.warning("KV peer copier failed (%s); copying by copy_blocks", exc.__cause__)
            self._copiers[agent] = None
            self._batchers.pop(key, None)
            return None
        times.phases.update(phases)
        times.batched = batch.size
        times.copy_seconds += time.perf_counter() - started
        return len(remote) * src[:, :, 0].numel() * src.element_size()

    def _copy_from(
        self,
        src: torch.Tensor,
        remote: list[int],
        local: list[int],
        times: PullTimes,
        called: float = 0.0,
    ) -> int:
        started = time.perf_counter()
        if called:
            times.phases["hop"] = started - called
        if self._stream is None:
            moved = copy_blocks(src, self.pool, remote, local, self.config.copy)
        else:
            begin = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            with torch.cuda.device(self.pool.device), torch.cuda.stream(self._stream):
                begin.record()
                moved = copy_blocks(src, self.pool, remote, local, self.config.copy)
                end.record()
            times.phases["launch"] = time.perf_counter() - started
            self._stream.synchronize()
            times.phases["device"] = begin.elapsed_time(end) / 1e3
        times.copy_done = time.perf_counter()
        times.copy_seconds += times.copy_done - started
        return moved

    async def _pull_nixl(self, transfer, pin, remote, local, times: PullTimes) -> int:
        peer, info = str(transfer["agent"]), transfer["nixl"]
        endpoint = self._nixl_endpoint()
        if not endpoint.has_peer(peer):
            try:
                answer = await self._request(transfer, {"op": "nixl", "pin": pin})
            except TransferError as exc:  # its NIXL agent failed: not a pin problem
                raise nixl.NixlError(str(exc)) from exc
            await asyncio.to_thread(endpoint.add_peer, peer, answer["metadata"], info)
        # As for IPC: the pin check runs while the bytes move; "not pinned" discards them.
        check = asyncio.ensure_future(self._checked(transfer, pin, remote))
        started = time.perf_counter()
        try:
            try:
                moved = await run_out(
                    endpoint.read, peer, int(info["blocks"]), remote, local, self.config.timeout
                )
            finally:
                await asyncio.wait({check})
            times.copy_seconds += time.perf_counter() - started
            check.result()
        except TransferError:  # not pinned: the peer is fine
            raise
        except BaseException:
            if check.done() and not check.cancelled():
                check.exception()  # retrieved: the read's own error is the one raised
            endpoint.drop_peer(peer)  # dead or restarted: loaded afresh next time
            raise
        return moved

    async def _pull_tcp(self, transfer, pin, remote, local, times: PullTimes) -> int:
        started = time.perf_counter()
        address = str(transfer.get("address"))
        timeout = self.config.timeout
        moved = await tcp.pull(self.pool, self._stream, address, pin, remote, local, timeout)
        times.copy_seconds += time.perf_counter() - started
        return moved

    def _batcher(self, key: tuple[str, str], make: Callable[[], Batcher]) -> Batcher:
        """The batcher of `key` (made by `make` the first time)."""
        batcher = self._batchers.get(key)
        if batcher is None:
            batcher = self._batchers[key] = make()
        return batcher

    async def _checked(self, transfer: dict[str, Any], pin: str, remote: list[int]) -> dict:
        """The pin check, with the other checks pending on that server in one round trip,
        given up after `timeout` seconds (a prefill worker that hangs must not hold the
        pull, and the decode side's blocks, for good; past that long the pin would have
        expired anyway)."""
        batcher = self._batcher(
            ("check", str(transfer.get("address"))),
            lambda: check_batcher(self._request, self.config.timeout, self.config.coalesce),
        )
        answer, _ = await batcher.submit((transfer, pin, remote))
        return answer

    async def release(self, transfer: dict[str, Any], pin: str) -> None:
        """Tell the prefill side it may unpin (best effort: its timeout is the backstop)."""
        try:
            source = local_agents.get(transfer.get("agent", ""))
            if source is not None and source.on_release is not None:
                await source.on_release(pin)
                return
            batcher = self._batcher(
                ("release", str(transfer.get("address"))),
                lambda: release_batcher(self._request, self.config.coalesce),
            )
            await batcher.submit((transfer, pin))
        except Exception as exc:
            log.debug("KV release of %s failed: %s", pin, exc)


async def run_out(fn, *args):
    """`fn(*args)` in a worker thread. A cancel waits for it to end before it raises:
    the copy writes this pool and reads the prefill pool, whose pin must outlast it."""
    future = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        await wait_out(future)
        raise
