"""A tensor-parallel pull (`rank_transfer.pull_all_ranks`) between CPU pools of two
"ranks" a side, in one process over TCP: each decode rank gets its own prefill rank's
blocks, rank 0 checks the pin for all, and a failing rank fails the pull once every rank
is over."""

from __future__ import annotations

import pytest
import torch

from stator.engines.native import rank_transfer
from stator.kv.block_copy import pool_shape
from stator.kv.transfer.agent import KvTransferAgent, TransferError
from stator.kv.transfer.config import TransferConfig

CONFIG = TransferConfig(kind="tcp")


def _pool(fill: bool) -> torch.Tensor:
    shape = pool_shape(2, 10, 4, 1, 8)
    return torch.randn(shape) if fill else torch.zeros(shape)


@pytest.fixture
async def sides():
    pins = {"p": [1, 2, 7]}

    async def release(pin: str) -> bool:
        return pins.pop(pin, None) is not None

    prefill0 = KvTransferAgent(CONFIG, _pool(True), pins=pins.get, release=release)
    prefill1 = rank_transfer.rank_agent(1, CONFIG, _pool(True))
    decode0 = KvTransferAgent(CONFIG, _pool(False))
    decode1 = rank_transfer.rank_agent(1, CONFIG, _pool(False))
    agents = [prefill0, prefill1, decode0, decode1]
    for agent in (prefill0, prefill1, decode1):
        await agent.serve()
    transfer = prefill0.describe() | {"ranks": [prefill1.describe()]}
    yield transfer, agents
    for agent in agents:
        await agent.close()


async def test_every_rank_pulls_its_own_prefill_rank(sides):
    transfer, (prefill0, prefill1, decode0, decode1) = sides
    ranks = [decode1.describe()]
    result = await rank_transfer.pull_all_ranks(decode0, ranks, transfer, "p", [7, 1], [0, 5])
    assert result.blocks == 2 and result.kind == "tcp"
    assert result.bytes == 2 * 2 * (2 * 2 * 4 * 8 * 4)  # two ranks' blocks
    assert torch.equal(decode0.pool[:, :, [0, 5]], prefill0.pool[:, :, [7, 1]])
    assert torch.equal(decode1.pool[:, :, [0, 5]], prefill1.pool[:, :, [7, 1]])
    assert not torch.equal(decode1.pool[:, :, [0, 5]], prefill0.pool[:, :, [7, 1]])


async def test_an_unpinned_pull_fails_after_every_rank_is_done(sides):
    transfer, (_, _, decode0, decode1) = sides
    with pytest.raises(TransferError, match="nothing pinned"):
        await rank_transfer.pull_all_ranks(
            decode0, [decode1.describe()], transfer, "gone", [1], [0]
        )
    # Rank 1 had nothing to check and read anyway; its pull was over before the error.
    assert decode1.pool[:, :, 0].abs().sum() > 0


async def test_different_tensor_parallel_sizes_are_refused(sides):
    transfer, (_, _, decode0, decode1) = sides
    with pytest.raises(TransferError, match="tensor-parallel sizes differ"):
        await rank_transfer.pull_all_ranks(decode0, [], transfer, "p", [1], [0])
    single = {k: v for k, v in transfer.items() if k != "ranks"}
    with pytest.raises(TransferError, match="prefill 1, decode 2"):
        await rank_transfer.pull_all_ranks(decode0, [decode1.describe()], single, "p", [1], [0])
