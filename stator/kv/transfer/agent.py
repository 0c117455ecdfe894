"""`KvTransferAgent`: one engine's end of KV transfer, both roles, in three parts:

- `serving.py` (prefill side): the server decode agents ask whether blocks are still
  pinned, read them over TCP, or release them; `describe()` tells them how to reach it;
- `pulling.py` (decode side): `pull` by the transport that fits (same process, CUDA IPC,
  NIXL, TCP) and `release`;
- `links.py` (decode side): the connection kept per prefill server for round trips.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import TYPE_CHECKING

import torch

from stator.kv.transfer import nixl
from stator.kv.transfer.batching import Batcher
from stator.kv.transfer.config import TransferConfig
from stator.kv.transfer.links import Link, Links
from stator.kv.transfer.pulling import PullSide, local_agents
from stator.kv.transfer.result import PullResult, TransferError
from stator.kv.transfer.serving import Claim, Operation, PinLookup, Release, ServeSide

if TYPE_CHECKING:  # imports Triton, which a CPU-only install may lack
    from stator.kv.transfer.peer_copier import PeerCopier

__all__ = ["KvTransferAgent", "PullResult", "TransferError"]


class KvTransferAgent(ServeSide, PullSide, Links):
    def __init__(
        self,
        config: TransferConfig,
        pool: torch.Tensor,
        *,
        pins: PinLookup | None = None,
        release: Release | None = None,
        claim: Claim | None = None,
    ) -> None:
        config.validate()
        self.config = config
        self.pool = pool
        self.pins = pins
        self.on_release = release
        self.on_claim = claim
        self.id = uuid.uuid4().hex
        self.server: asyncio.base_events.Server | None = None
        self.address: str | None = None
        self.ops: dict[str, Operation] = {}  # served beside acquire / read / release / nixl
        self._ipc_handle: bytes | None = None
        self._clients: set[asyncio.StreamWriter] = set()  # decode agents connected here
        self._opened: dict[str, torch.Tensor] = {}  # remote agent id -> its pool
        self._copiers: dict[str, PeerCopier | None] = {}
        self._links: dict[str, Link] = {}
        self._batchers: dict[tuple[str, str], Batcher] = {}
        self._stream = torch.cuda.Stream(pool.device) if pool.is_cuda else None
        self._nixl: nixl.NixlEndpoint | None = None  # made on first use
        local_agents[self.id] = self

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            for client in list(self._clients):
                client.close()
            with contextlib.suppress(Exception):
                await self.server.wait_closed()
            self.server = None
        for batcher in self._batchers.values():
            batcher.close()
        self._batchers.clear()
        self._close_links()
        self._copiers.clear()
        self._opened.clear()
        if self._nixl is not None:
            self._nixl.close()
            self._nixl = None
        local_agents.pop(self.id, None)
