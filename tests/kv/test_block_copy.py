from __future__ import annotations

import pytest
import torch

from stator.kv.block_copy import (
    BlockMover,
    block_bytes,
    block_shape,
    gather,
    pool_shape,
    runs,
    scatter,
)


def _pool(device: str = "cpu", blocks: int = 9) -> torch.Tensor:
    shape = pool_shape(num_layers=3, num_blocks=blocks, block_size=4, num_kv_heads=2, head_dim=5)
    return torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(device)


def test_gather_is_block_major_copy_of_each_layer():
    pool = _pool()
    out = gather(pool, [7, 2, 5])
    assert out.shape == (3, *block_shape(pool))
    assert out.is_contiguous()
    for i, b in enumerate([7, 2, 5]):
        for layer in range(3):
            assert torch.equal(out[i, layer, 0], pool[layer, 0, b])  # keys
            assert torch.equal(out[i, layer, 1], pool[layer, 1, b])  # values
    assert block_bytes(pool) == 3 * 2 * 4 * 2 * 5 * 4


def test_scatter_inverts_gather_and_touches_nothing_else():
    pool = _pool()
    data = gather(pool, [1, 3])
    target = torch.zeros_like(pool)
    scatter(target, [6, 0], data)
    assert torch.equal(target[:, :, 6], pool[:, :, 1])
    assert torch.equal(target[:, :, 0], pool[:, :, 3])
    untouched = [b for b in range(9) if b not in (0, 6)]
    assert not target[:, :, untouched].any()


def test_runs_of_consecutive_slots():
    assert runs([]) == []
    assert runs([4]) == [(0, 4, 1)]
    assert runs([3, 4, 5, 9, 10, 2]) == [(0, 3, 3), (3, 9, 2), (5, 2, 1)]


def test_mover_round_trip_on_cpu():
    pool = _pool()
    host = torch.zeros((6, *block_shape(pool)))
    mover = BlockMover(pool)
    assert mover.save([8, 1, 4], host, [2, 3, 0]) is None
    assert torch.equal(host[2], gather(pool, [8])[0])
    assert torch.equal(host[0], gather(pool, [4])[0])
    fresh = torch.zeros_like(pool)
    BlockMover(fresh).load(host, [0, 2, 3], [5, 6, 7])
    assert torch.equal(fresh[:, :, 5], pool[:, :, 4])
    assert torch.equal(fresh[:, :, 6], pool[:, :, 8])
    assert torch.equal(fresh[:, :, 7], pool[:, :, 1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mover_round_trip_on_cuda_with_pinned_host():
    pool = _pool("cuda", blocks=64)
    host = torch.zeros((32, *block_shape(pool)), pin_memory=True)
    mover = BlockMover(pool)
    ids = list(range(10, 30))
    expected = pool[:, :, ids].clone()
    done = mover.save(ids, host, list(range(5, 25)))
    pool[:, :, ids] = 0  # enqueued after the gather: the saved copy must not see it
    done.synchronize()
    mover.wait(mover.load(host, list(range(5, 25)), ids))
    assert torch.equal(pool[:, :, ids], expected)
