"""The NIXL transport: one engine's KV pool registered with a NIXL agent (UCX: RDMA between
hosts, shared memory or TCP when that is all there is), blocks read from a peer's pool by
one NIXL request per pull.

The pool (`[layers, 2, blocks, block_size, heads, dim]`, contiguous) is registered once, as
one region, and described once as a list of every (layer, k/v, block) slab: descriptor
`plane * blocks + block` is the slab at `base + (plane * blocks + block) * slab_bytes`. A
pull is then two index arrays into the two sides' lists, built by numpy broadcasting: no
per-block Python objects, whatever the number of blocks.

Everything here blocks (NIXL's calls, the wait for a transfer): callers run it in a thread.
The agent is made with NIXL's progress thread (without it, a DRAM -> DRAM transfer through
UCX never completed on the project's CPU machine) and strict thread synchronization (pulls
run in several threads at once).
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

# Spin on a transfer's state this long before sleeping between checks: a small pull is done
# in tens of microseconds, and a sleep costs more than that.
SPIN_SECONDS = 0.002
POLL_SLEEP = 0.0001


def available() -> bool:
    """Whether the `nixl` package is installed (`pip install stator[nixl]`); cheap, imports
    nothing."""
    return importlib.util.find_spec("nixl") is not None


class NixlError(Exception):
    """A NIXL call or transfer failed."""


def slab_bytes(pool: torch.Tensor) -> int:
    """Bytes of one (layer, k/v, block) slab: one block's keys or values of one layer."""
    return pool[0, 0, 0].numel() * pool.element_size()


def pool_descriptors(base: int, planes: int, blocks: int, slab: int, device: int) -> np.ndarray:
    """The Nx3 (address, length, device) list of every slab of a pool, plane-major."""
    out = np.empty((planes * blocks, 3), dtype=np.uint64)
    out[:, 0] = base + np.arange(planes * blocks, dtype=np.uint64) * np.uint64(slab)
    out[:, 1] = slab
    out[:, 2] = device
    return out


def slab_indices(block_ids: list[int], planes: int, blocks: int) -> np.ndarray:
    """Descriptor indices of `block_ids`' slabs in every plane, in the order both sides use."""
    ids = np.asarray(block_ids, dtype=np.int64)
    return (
        (np.arange(planes, dtype=np.int64)[:, None] * blocks + ids[None, :])
        .ravel()
        .astype(np.int32)
    )


def region(pool: torch.Tensor) -> dict[str, Any]:
    """What a peer needs to address this pool (it goes into `describe()`)."""
    return {
        "base": pool.data_ptr(),
        "blocks": pool.shape[2],
        "device": (pool.device.index or 0) if pool.is_cuda else 0,
        "mem": "VRAM" if pool.is_cuda else "DRAM",
    }


@dataclass
class _Peer:
    name: str  # the remote NIXL agent's name
    dlist: Any  # its pool's descriptors, prepared for reads


class NixlEndpoint:
    """This engine's NIXL agent, made (and its pool registered) on first use."""

    def __init__(self, name: str, pool: torch.Tensor) -> None:
        if not pool.is_contiguous():
            raise NixlError("NIXL needs a contiguous KV pool")
        self.name = name
        self.pool = pool
        self.planes = pool.shape[0] * pool.shape[1]
        self._agent: Any = None
        self._registered: Any = None  # the pool's registration
        self._local: Any = None  # this pool's descriptors, prepared
        self._peers: dict[str, _Peer] = {}  # remote stator agent id -> its NIXL peer
        self._lock = threading.Lock()  # one thread makes the agent / adds a peer

    def _ensure(self) -> Any:
        with self._lock:
            if self._agent is None:
                from nixl._api import nixl_agent, nixl_agent_config, nixl_thread_sync_t

                config = nixl_agent_config(
                    enable_prog_thread=True,
                    backends=["UCX"],
                    sync_mode=nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT,
                )
                agent = nixl_agent(self.name, config)
                if "UCX" not in agent.backends:
                    raise NixlError("NIXL has no UCX backend here")
                mine = region(self.pool)
                self._registered = agent.register_memory(self.pool)
                descs = pool_descriptors(
                    mine["base"], self.planes, mine["blocks"], slab_bytes(self.pool), mine["device"]
                )
                self._local = agent.prep_xfer_dlist("NIXL_INIT_AGENT", descs, mine["mem"])
                self._agent = agent
                log.info("NIXL agent %s: KV pool registered (%s)", self.name, mine["mem"])
            return self._agent

    def metadata(self) -> bytes:
        """This agent's metadata (its address and the pool's registration), for a peer's
        `add_peer`."""
        return bytes(self._ensure().get_agent_metadata())

    def has_peer(self, peer_id: str) -> bool:
        return peer_id in self._peers

    def add_peer(self, peer_id: str, metadata: bytes, remote: dict[str, Any]) -> None:
        """Load a peer's metadata and prepare its pool's descriptors, once per peer."""
        agent = self._ensure()
        with self._lock:
            if peer_id in self._peers:
                return
            name = agent.add_remote_agent(metadata)
            name = name.decode() if isinstance(name, bytes) else str(name)
            slab = slab_bytes(self.pool)  # the layouts match: checked before any pull
            descs = pool_descriptors(
                int(remote["base"]), self.planes, int(remote["blocks"]), slab, int(remote["device"])
            )
            self._peers[peer_id] = _Peer(name, agent.prep_xfer_dlist(name, descs, remote["mem"]))

    def drop_peer(self, peer_id: str) -> None:
        """Forget a peer (it failed): a later pull loads its metadata again."""
        with self._lock:
            peer = self._peers.pop(peer_id, None)
            if peer is None or self._agent is None:
                return
            for release in (
                lambda: self._agent.release_dlist_handle(peer.dlist),
                lambda: self._agent.remove_remote_agent(peer.name),
            ):
                try:
                    release()
                except Exception as exc:
                    log.debug("NIXL cleanup of %s: %s", peer.name, exc)

    def read(
        self, peer_id: str, remote_blocks: int, remote: list[int], local: list[int], timeout: float
    ) -> int:
        """Read blocks `remote[i]` of the peer's pool into blocks `local[i]` of this one;
        returns the bytes moved. Raises NixlError (the transfer failed or took longer than
        `timeout` seconds)."""
        agent = self._ensure()
        peer = self._peers[peer_id]
        mine = slab_indices(local, self.planes, self.pool.shape[2])
        theirs = slab_indices(remote, self.planes, remote_blocks)
        handle = agent.make_prepped_xfer("READ", self._local, mine, peer.dlist, theirs)
        try:
            state = agent.transfer(handle)
            started = time.perf_counter()
            while state == "PROC":
                waited = time.perf_counter() - started
                if waited > timeout:
                    raise NixlError(
                        f"NIXL read of {len(remote)} blocks still running after {timeout} s"
                    )
                if waited > SPIN_SECONDS:
                    time.sleep(POLL_SLEEP)
                state = agent.check_xfer_state(handle)
            if state != "DONE":
                raise NixlError(f"NIXL read of {len(remote)} blocks failed ({state})")
        finally:
            try:
                agent.release_xfer_handle(handle)
            except Exception as exc:  # still active (timed out): NIXL keeps it to the end
                log.warning("NIXL transfer handle not released: %s", exc)
        return len(remote) * slab_bytes(self.pool) * self.planes

    def close(self) -> None:
        for peer_id in list(self._peers):
            self.drop_peer(peer_id)
        agent, self._agent = self._agent, None
        if agent is not None:
            try:
                agent.release_dlist_handle(self._local)
                agent.deregister_memory(self._registered)
            except Exception as exc:
                log.debug("NIXL cleanup of %s: %s", self.name, exc)
        self._local = self._registered = None
