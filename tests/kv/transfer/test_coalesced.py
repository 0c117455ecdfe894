"""The decode agent's IPC copy path through its copy batcher (`coalesced.copy_batcher`,
`PullSide._copy_by`), with a fake `PeerCopier` on CPU pools: pulls pending together are
one launch over the union of their ids, each pull gets its own bytes and phases, and a
launch that fails sends every member to `copy_blocks` (and the copier is dropped)."""

from __future__ import annotations

import asyncio

import torch

from stator.kv.block_copy import pool_shape
from stator.kv.transfer.agent import KvTransferAgent
from stator.kv.transfer.config import TransferConfig
from stator.kv.transfer.copy import copy_blocks
from stator.kv.transfer.pulling import PullTimes


class Done:
    """A finished CUDA event's stand-in."""

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other) -> float:
        return 0.25  # ms


class FakeCopier:
    def __init__(self, src, dst) -> None:
        self.src, self.dst = src, dst
        self.launches: list[tuple[list[int], list[int]]] = []
        self.fail = False

    def launch(self, remote, local):
        if self.fail:
            raise RuntimeError("graph replay refused")
        self.launches.append((list(remote), list(local)))
        copy_blocks(self.src, self.dst, remote, local)
        return Done(), Done()


def pools():
    src = torch.randn(pool_shape(2, 40, 4, 2, 8))
    return src, torch.zeros(pool_shape(2, 40, 4, 2, 8))


async def test_pulls_pending_together_are_one_launch_over_the_union():
    src, dst = pools()
    agent = KvTransferAgent(TransferConfig(kind="ipc"), dst)
    copier = FakeCopier(src, dst)
    pulls = [([1, 2], [10, 11]), ([7], [3]), ([30, 31, 32], [20, 21, 22])]
    times = [PullTimes() for _ in pulls]
    copies = [
        agent._copy_by("peer", copier, src, r, lo, t)
        for (r, lo), t in zip(pulls, times, strict=True)
    ]
    moved = await asyncio.gather(*copies)
    # The first finds the batcher idle and starts alone; the two pending behind it go as one.
    assert copier.launches == [([1, 2], [10, 11]), ([7, 30, 31, 32], [3, 20, 21, 22])]
    block = src[:, :, 0].numel() * src.element_size()
    assert moved == [2 * block, block, 3 * block]
    assert [t.batched for t in times] == [1, 2, 2]
    assert all(t.phases["device"] == 0.25e-3 for t in times)
    for remote, local in pulls:
        assert torch.equal(dst[:, :, local], src[:, :, remote])
    # Alone, a pull is its own launch.
    await agent._copy_by("peer", copier, src, [5], [6], PullTimes())
    assert copier.launches[-1] == ([5], [6])
    await agent.close()


async def test_uncoalesced_pulls_launch_one_each():
    src, dst = pools()
    agent = KvTransferAgent(TransferConfig(kind="ipc", coalesce=False), dst)
    copier = FakeCopier(src, dst)
    await asyncio.gather(
        *(agent._copy_by("peer", copier, src, [b], [b], PullTimes()) for b in (1, 2, 3))
    )
    assert copier.launches == [([1], [1]), ([2], [2]), ([3], [3])]
    await agent.close()


async def test_a_failed_launch_sends_every_member_to_copy_blocks_and_drops_the_copier():
    src, dst = pools()
    agent = KvTransferAgent(TransferConfig(kind="ipc"), dst)
    copier = FakeCopier(src, dst)
    copier.fail = True
    agent._copiers["peer"] = copier
    moved = await asyncio.gather(
        *(agent._copy_by("peer", copier, src, [b], [b + 1], PullTimes()) for b in (1, 5))
    )
    assert moved == [None, None]  # the caller copies these by copy_blocks
    assert agent._copiers["peer"] is None and ("copy", "peer") not in agent._batchers
    await agent.close()
