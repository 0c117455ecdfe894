"""KV transfer for a tensor-parallel engine in the prefill or decode role: every rank holds
its own heads' KV pool (same block ids on every rank: rank 0 schedules for all), so every
rank gets a transfer agent, and a pull is one pull per rank, prefill rank r to decode rank r.

- Each rank 1..N-1 (`serve_when_asked`, a thread beside its step loop) waits for rank 0 to
  publish the transfer config in the group's store, then starts an agent on its own pool
  (a server with its own event loop) and publishes the agent's description.
- Rank 0 (`start_rank_agents`) publishes the config and collects those descriptions. A
  prefill engine's `DisaggParams.transfer` is rank 0's description plus `ranks`, the other
  ranks' descriptions; a decode engine keeps its own ranks' descriptions.
- `pull_all_ranks`: rank 0 pulls its pool and asks each decode rank r (a `pull` operation
  on its agent's server) to pull prefill rank r's, all at once, and returns when every rank
  has answered, whatever failed (a copy still running must never land in freed blocks; a
  rank's own pull is bounded by the transfer timeout, and a rank silent past it is dead).

Pins live on prefill rank 0 only: rank 0's pull checks them as any pull does, while the
other ranks read unchecked; a pin lasts until the decode side releases it (or a timeout),
so the check made during the pull covers every rank's read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
import time
from datetime import timedelta
from typing import Any

import msgspec
import torch
import torch.distributed as dist

from stator.kv.transfer.agent import KvTransferAgent, PullResult, TransferError
from stator.kv.transfer.config import TransferConfig

log = logging.getLogger(__name__)

CONFIG_KEY = "kv-transfer-config"
STARTED_TIMEOUT_S = 120.0
# A rank's pull answers within the transfer timeout (a NIXL read's limit) plus this.
PULL_GRACE_S = 10.0


def agent_key(rank: int) -> str:
    return f"kv-transfer-agent-{rank}"


# -- ranks 1..N-1 ---------------------------------------------------------------------


def serve_when_asked(rank: int, size: int, port: int, pool: torch.Tensor) -> None:
    """Start the thread that gives this rank an agent once rank 0 asks (prefill and
    decode roles; an aggregated engine never asks)."""
    thread = threading.Thread(
        target=_wait_and_serve, args=(rank, size, port, pool), name="kv-transfer", daemon=True
    )
    thread.start()


def _wait_and_serve(rank: int, size: int, port: int, pool: torch.Tensor) -> None:
    try:
        store = dist.TCPStore("127.0.0.1", port, size, is_master=False, timeout=timedelta(days=1))
        store.wait([CONFIG_KEY])
        config = TransferConfig(**json.loads(store.get(CONFIG_KEY)))
    except Exception as exc:  # rank 0 went away: the rank exits with it
        log.debug("rank %d: no KV transfer (%s)", rank, exc)
        return
    asyncio.run(_serve(rank, store, config, pool))


def rank_agent(rank: int, config: TransferConfig, pool: torch.Tensor) -> KvTransferAgent:
    """A rank's agent: no pins (rank 0 checks them), and a `pull` operation for rank 0."""
    agent = KvTransferAgent(config, pool)

    async def pull(message: dict[str, Any]) -> dict[str, Any]:
        try:
            result = await agent.pull(
                message["transfer"], str(message["pin"]), message["remote"], message["local"]
            )
        except Exception as exc:
            return {"ok": False, "error": f"rank {rank}: {exc}"}
        return {"ok": True, "result": dataclasses.asdict(result)}

    agent.ops["pull"] = pull
    return agent


async def _serve(rank: int, store: dist.Store, config: TransferConfig, pool: torch.Tensor):
    agent = rank_agent(rank, config, pool)
    await agent.serve()
    store.set(agent_key(rank), msgspec.msgpack.encode(agent.describe()))
    log.info("rank %d: KV transfer agent at %s", rank, agent.address)
    await asyncio.Event().wait()  # the process ends with rank 0


# -- rank 0 -------------------------------------------------------------------------------


async def start_rank_agents(store: dist.Store, size: int, config: TransferConfig) -> list[dict]:
    """Ask ranks 1..N-1 for their agents; their descriptions, rank by rank."""
    store.set(CONFIG_KEY, json.dumps(dataclasses.asdict(config)))
    keys = [agent_key(rank) for rank in range(1, size)]
    deadline = time.monotonic() + STARTED_TIMEOUT_S
    while not store.check(keys):
        if time.monotonic() > deadline:
            raise TimeoutError("the tensor-parallel ranks did not start their KV transfer agents")
        await asyncio.sleep(0.05)
    return [msgspec.msgpack.decode(store.get(key)) for key in keys]


async def pull_all_ranks(
    agent: KvTransferAgent,
    ranks: list[dict],
    transfer: dict[str, Any],
    pin: str,
    remote: list[int],
    local: list[int],
) -> PullResult:
    """Every rank's pull of the same blocks (see the module docstring); raises
    TransferError once all are over if any failed."""
    theirs = transfer.get("ranks") or []
    if len(theirs) != len(ranks):
        raise TransferError(
            f"tensor-parallel sizes differ: prefill {len(theirs) + 1}, decode {len(ranks) + 1}"
        )
    started = time.perf_counter()
    limit = agent.config.timeout + PULL_GRACE_S

    async def on_rank(mine: dict, source: dict) -> PullResult:
        message = {"op": "pull", "transfer": source, "pin": pin, "remote": remote, "local": local}
        answer = await asyncio.wait_for(agent._request(mine, message), limit)
        return PullResult(**answer["result"])

    results = await asyncio.gather(
        agent.pull(transfer, pin, remote, local),
        *(on_rank(mine, source) for mine, source in zip(ranks, theirs, strict=True)),
        return_exceptions=True,
    )
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise TransferError(f"{len(failed)} of {len(results)} ranks failed: {failed[0]}")
    done: list[PullResult] = results  # type: ignore[assignment]
    return PullResult(
        kind=done[0].kind,
        bytes=sum(r.bytes for r in done),
        blocks=len(remote),
        seconds=time.perf_counter() - started,
        copy_seconds=max(r.copy_seconds for r in done),
        phases=done[0].phases,  # rank 0's
        batched=done[0].batched,
    )
