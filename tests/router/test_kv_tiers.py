"""Lower KV tiers in the router: host and disk hits count, for less than GPU hits."""

from __future__ import annotations

import pytest

from stator.protocols import AllCleared, BlockRemoved, BlockStored
from stator.router import RouterConfig
from stator.router.kv_index import KvIndex
from tests.router.fleet import collect, request, start_router, until
from tests.router.test_router import HASHES, PROMPT, routed_to

W = {"host": 0.75, "disk": 0.25}


def _stored(hashes, tier):
    return BlockStored(block_hashes=hashes, tier=tier)


def test_weighted_prefix_continues_through_lower_tiers():
    index = KvIndex(block_size=16)
    a, b = (1, 0), (2, 0)
    index.apply(a, _stored([10, 11], "gpu"))
    index.apply(a, _stored([12], "host"))
    index.apply(a, _stored([11, 13], "disk"))  # 11 is also on GPU: its best tier counts
    index.apply(b, _stored([10, 11, 12, 13], "disk"))
    assert index.find_weighted([10, 11, 12, 13, 14], W) == {a: 2 + 0.75 + 0.25, b: 1.0}
    assert index.find_matches([10, 11, 12]) == {a: 2}  # the GPU tier alone, as before
    assert index.tree_size(a) == 2
    # Leaving host does not touch the GPU copy, and vice versa.
    index.apply(a, BlockRemoved(block_hashes=[12], tier="host"))
    assert index.find_weighted([10, 11, 12, 13], W) == {a: 2.0, b: 1.0}
    index.apply(a, BlockRemoved(block_hashes=[11]))
    assert index.find_weighted([10, 11], W) == {a: 1.25, b: 0.5}
    index.apply(b, AllCleared())
    assert index.find_weighted([10, 11], W) == {a: 1.25}


def test_unknown_tier_is_ignored_and_no_tiers_is_the_plain_walk():
    index = KvIndex(block_size=16)
    index.apply((1, 0), _stored([10, 11], "gpu"))
    index.apply((1, 0), _stored([12], "tape"))
    assert not index.has_lower_tiers()
    assert index.find_weighted([10, 11, 12], W) == {(1, 0): 2}


@pytest.mark.parametrize(("host_weight", "winner"), [(0.75, 0), (0.25, 1)])
async def test_router_weighs_a_host_hit_against_a_gpu_hit(host_weight, winner):
    config = RouterConfig(router_mode="kv", router_seed=1, kv_host_overlap_weight=host_weight)
    router, workers = await start_router(2, config)
    # Worker 0 holds all 4 blocks in host memory (worth 4 * w), worker 1 two on its GPU.
    await workers[0].publish_stored(HASHES, tier="host")
    await workers[1].publish_stored(HASHES[:2])
    await until(lambda: router.index.tree_size((workers[1].id, 0)) == 2)
    await until(lambda: router.index.has_lower_tiers())
    await collect(router, request("r", PROMPT))
    assert routed_to(workers, "r") == [workers[winner]]
    await router.close()


def test_tier_weights_are_validated():
    with pytest.raises(ValueError, match="kv_disk_overlap_weight"):
        RouterConfig(kv_disk_overlap_weight=1.5).validate()
