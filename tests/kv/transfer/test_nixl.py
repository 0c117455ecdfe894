"""The NIXL transport between two CPU pools (DRAM -> DRAM through UCX): the descriptor
arithmetic, pulls that move exactly the named blocks, the pin check, `auto`'s choice, and
the fall back to TCP when the prefill side's NIXL agent cannot be had."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stator.kv.block_copy import pool_shape
from stator.kv.transfer import nixl
from stator.kv.transfer.agent import KvTransferAgent, TransferError
from stator.kv.transfer.config import TransferConfig
from tests.kv.transfer.nixl_required import needs_nixl


def test_descriptors_address_every_slab_of_the_pool():
    pool = torch.randn(pool_shape(3, 7, 4, 2, 8))
    slab = nixl.slab_bytes(pool)
    descs = nixl.pool_descriptors(pool.data_ptr(), 6, 7, slab, 0)
    assert descs.shape == (42, 3) and slab == 4 * 2 * 8 * 4
    for layer, kv, block in [(0, 0, 0), (1, 1, 3), (2, 0, 6), (2, 1, 6)]:
        index = (layer * 2 + kv) * 7 + block
        assert descs[index, 0] == pool[layer, kv, block].data_ptr()
        assert descs[index, 1] == slab
    indices = nixl.slab_indices([5, 2], planes=6, blocks=7)
    assert indices.dtype == np.int32
    assert list(indices) == [p * 7 + b for p in range(6) for b in (5, 2)]


async def _pair(kind: str, pins: dict, released: list | None = None):
    async def release(pin: str) -> bool:
        if released is not None:
            released.append(pin)
        return pins.pop(pin, None) is not None

    src = torch.randn(pool_shape(2, 16, 4, 2, 8))
    prefill = KvTransferAgent(TransferConfig(kind=kind), src, pins=pins.get, release=release)
    await prefill.serve()
    decode = KvTransferAgent(TransferConfig(kind=kind), torch.zeros(pool_shape(2, 12, 4, 2, 8)))
    return prefill, decode


@needs_nixl
async def test_a_nixl_pull_moves_exactly_the_named_blocks():
    pins = {"p1": [1, 5, 6, 7, 15], "p2": [2]}
    prefill, decode = await _pair("nixl", pins)
    try:
        transfer = prefill.describe()
        assert transfer["nixl"]["mem"] == "DRAM"
        result = await decode.pull(transfer, "p1", [15, 5, 6, 7, 1], [0, 3, 4, 5, 11])
        assert result.kind == "nixl" and result.blocks == 5
        assert result.bytes == 5 * 2 * 2 * 4 * 2 * 8 * 4
        assert torch.equal(
            decode.pool[:, :, [0, 3, 4, 5, 11]], prefill.pool[:, :, [15, 5, 6, 7, 1]]
        )
        untouched = [b for b in range(12) if b not in (0, 3, 4, 5, 11)]
        assert decode.pool[:, :, untouched].abs().sum() == 0
        # The peer is loaded once; later pulls reuse it.
        result = await decode.pull(transfer, "p2", [2], [1])
        assert torch.equal(decode.pool[:, :, 1], prefill.pool[:, :, 2])
        assert list(decode._nixl._peers) == [prefill.id]
        # Blocks no longer pinned: the pull fails (what was read is discarded by the caller).
        with pytest.raises(TransferError, match="nothing pinned"):
            await decode.pull(transfer, "gone", [3], [2])
        with pytest.raises(TransferError, match="not pinned"):
            await decode.pull(transfer, "p2", [3], [2])
    finally:
        await decode.close()
        await prefill.close()


@needs_nixl
async def test_auto_picks_nixl_for_another_host_only():
    prefill, decode = await _pair("auto", {"p": [1]})
    try:
        transfer = prefill.describe() | {"pid": -1}  # as if another process
        assert "nixl" in transfer
        assert decode.choose(transfer) == "tcp"  # same host, CPU pools
        elsewhere = transfer | {"host": "another-host/boot", "pid": -1}
        assert decode.choose(elsewhere) == "nixl"
        result = await decode.pull(elsewhere, "p", [1], [4])
        assert result.kind == "nixl"
        assert torch.equal(decode.pool[:, :, 4], prefill.pool[:, :, 1])
    finally:
        await decode.close()
        await prefill.close()


@needs_nixl
async def test_auto_falls_back_to_tcp_when_the_prefill_side_has_no_nixl_agent():
    prefill, decode = await _pair("auto", {"p": [1, 2]})
    try:
        prefill.config.kind = "tcp"  # now refuses the `nixl` request
        elsewhere = prefill.describe() | {"host": "another-host/boot", "pid": -1}
        elsewhere["nixl"] = nixl.region(prefill.pool)
        result = await decode.pull(elsewhere, "p", [1, 2], [3, 4])
        assert result.kind == "tcp"
        assert torch.equal(decode.pool[:, :, [3, 4]], prefill.pool[:, :, [1, 2]])
        assert decode._nixl is not None and not decode._nixl._peers
    finally:
        await decode.close()
        await prefill.close()


async def test_a_prefill_side_without_nixl_does_not_offer_it(monkeypatch):
    monkeypatch.setattr(nixl, "available", lambda: False)
    prefill, decode = await _pair("auto", {})
    try:
        assert "nixl" not in prefill.describe()
    finally:
        await decode.close()
        await prefill.close()


@needs_nixl
async def test_a_dead_prefill_side_fails_the_pull_and_is_forgotten():
    prefill, decode = await _pair("nixl", {"p": [1, 2]})
    try:
        transfer = prefill.describe()
        await decode.pull(transfer, "p", [1], [3])
        assert decode._nixl.has_peer(prefill.id)
        await prefill.close()  # its server and its NIXL agent are gone
        with pytest.raises(TransferError):
            await decode.pull(transfer, "p", [2], [4])
        assert not decode._nixl.has_peer(prefill.id)
    finally:
        await decode.close()
        await prefill.close()
