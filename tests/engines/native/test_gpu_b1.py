"""GPT-OSS's batch-1 decode kernels on CUDA (skipped without a GPU), in the real shapes:
the row-tile streaming MoE kernels (`moe_stream.py`) with and without programmatic
dependent launch, eagerly and in a CUDA graph, against moe_gemv's kernels and
the reference; routing from the router GEMV's split-K partial sums."""

from __future__ import annotations

import pytest
import torch

from stator.engines.native.sharding import TPShard
from tests.engines.native.test_gpu_gpt_oss import _moe

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.mark.parametrize("tokens", [1, 3, 8])
@pytest.mark.parametrize("pdl", [True, False])
def test_row_tile_kernels_match_moe_gemv_and_the_reference(monkeypatch, tokens, pdl):
    from stator.engines.native.kernels import moe_gemv, moe_stream

    monkeypatch.setattr(moe_stream, "DOWN_PDL", pdl)
    for tp in (TPShard(), TPShard(rank=1, size=2)):
        moe = _moe(True, tp)
        x = torch.randn(tokens, 2880, device="cuda", dtype=torch.bfloat16)
        weights, ids = moe.route(x)
        ref = moe._reference(x, weights, ids).float()
        monkeypatch.setattr(moe_stream, "ENABLED", False)
        old = moe_gemv.moe_gemv(x, weights, ids, moe).float()
        monkeypatch.setattr(moe_stream, "ENABLED", True)
        new = moe_gemv.moe_gemv(x, weights, ids, moe).float()
        assert float((new - ref).norm() / ref.norm()) < 1e-2
        # The same fp16 sums of each word as moe_gemv's kernels, added in another order.
        assert float((new - old).norm() / old.norm()) < 2e-3
        untouched = ~((ids >= moe.first) & (ids < moe.first + moe.local)).any(1)
        if untouched.any():  # tokens routed to another rank's experts only: 0
            assert new[untouched].abs().max() == 0


@pytest.mark.parametrize("tile", [(2, 16, 4), (4, 8, 4), (2, 8, 4), (8, 4, 8)])
def test_row_tile_kernels_replay_in_a_cuda_graph(monkeypatch, tile):
    """Captured with PDL between the up and the down kernel, as a decode graph holds them,
    for several tiles: the replay equals the eager result."""
    from stator.engines.native.kernels import moe_stream
    from stator.engines.native.kernels.fused_moe import fused_moe

    monkeypatch.setattr(moe_stream, "UP_CONFIG", tile)
    monkeypatch.setattr(moe_stream, "DOWN_CONFIG", tile)
    moe = _moe(True)
    x = torch.randn(1, 2880, device="cuda", dtype=torch.bfloat16)
    weights, ids = moe.route(x)
    fused_moe(x, weights, ids, moe)  # compiled before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(3):  # back to back: each down overlaps the next up's launch
            out = fused_moe(x, weights, ids, moe)
    x.copy_(torch.randn_like(x))  # new inputs and routing in place, then replay
    new_weights, new_ids = moe.route(x)
    weights.copy_(new_weights)
    ids.copy_(new_ids)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, fused_moe(x, weights, ids, moe))


def test_routing_from_router_gemv_partials():
    from stator.engines.native.kernels.gemv import GemvConfig, gemv
    from stator.engines.native.kernels.moe_route import route

    moe = _moe(True)
    x = torch.randn(3, 2880, device="cuda", dtype=torch.bfloat16)
    w, b = moe.router.weight, moe.router.bias
    cfg = GemvConfig(16, 128, 4)
    want = route(gemv(x, w, cfg, b), 4, x)
    got = route(gemv(x, w, cfg, reduce=False), 4, x, 4, b)
    for a, c in zip(got, want, strict=True):
        assert torch.equal(a, c)
