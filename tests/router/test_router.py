import asyncio

import pytest

from stator.kv.hashing import block_hashes
from stator.protocols import KvEvent, RoutingHints
from stator.router import BadRouting, Overloaded, RouterConfig
from stator.runtime import NoInstances
from tests.router.fleet import BS, collect, request, start_router, until

PROMPT = list(range(1, 4 * BS + 1))  # 4 full blocks
HASHES = block_hashes(PROMPT, BS)


def routed_to(workers, rid):
    return [w for w in workers if any(r.request_id == rid for r in w.requests)]


async def test_round_robin_alternates():
    router, workers = await start_router(2, RouterConfig(router_mode="round-robin"))
    for i in range(4):
        outs = await collect(router, request(f"r{i}", [1]))
        assert [t for o in outs for t in o.token_ids] == [2, 3, 4, 5]
    assert [len(w.requests) for w in workers] == [2, 2]
    assert router.metrics.decisions.labels("m", "round-robin")._value.get() == 4
    await router.close()


async def test_direct_mode_needs_a_live_target():
    router, workers = await start_router(2, RouterConfig(router_mode="direct"))
    target = workers[1].id
    await collect(router, request("r1", [1], routing=RoutingHints(target_worker_id=target)))
    assert len(workers[1].requests) == 1 and not workers[0].requests
    with pytest.raises(BadRouting):
        await collect(router, request("r2", [1]))
    with pytest.raises(NoInstances):
        await collect(router, request("r3", [1], routing=RoutingHints(target_worker_id=12345)))
    await router.close()


async def test_least_loaded_avoids_the_busy_worker():
    router, workers = await start_router(2, RouterConfig(router_mode="least-loaded"))
    workers[0].release.clear()
    workers[1].release.clear()
    slow = asyncio.create_task(collect(router, request("slow", [1])))
    await until(lambda: sum(len(w.requests) for w in workers) == 1)
    busy = routed_to(workers, "slow")[0]
    free = workers[1] if busy is workers[0] else workers[0]
    free.release.set()
    await collect(router, request("next", [1]))
    assert routed_to(workers, "next") == [free]
    busy.release.set()
    await slow
    await router.close()


async def test_least_loaded_counts_prompt_tokens_not_requests():
    """One long prompt waiting for its first token outweighs two one-token requests."""
    router, workers = await start_router(2, RouterConfig(router_mode="least-loaded"))
    for w in workers:
        w.release.clear()
    long = asyncio.create_task(collect(router, request("long", list(range(1, 40 * BS)))))
    await until(lambda: sum(len(w.requests) for w in workers) == 1)
    heavy = routed_to(workers, "long")[0]
    light = workers[1] if heavy is workers[0] else workers[0]
    shorts = [asyncio.create_task(collect(router, request(f"s{i}", [1]))) for i in range(3)]
    await until(lambda: sum(len(w.requests) for w in workers) == 4)
    # By requests in flight `light` held 1 when the third short one came; it still wins.
    assert all(routed_to(workers, f"s{i}") == [light] for i in range(3))
    for w in workers:
        w.release.set()
    await asyncio.gather(long, *shorts)
    await router.close()


async def test_kv_mode_follows_kv_events():
    router, workers = await start_router(3, RouterConfig(router_mode="kv", router_seed=1))
    holder = workers[2]
    await holder.publish_stored(HASHES[:3])
    await until(lambda: router.index.tree_size((holder.id, 0)) == 3)
    await collect(router, request("r1", PROMPT))
    assert routed_to(workers, "r1") == [holder]
    assert router.metrics.overlap_blocks.labels("m")._sum.get() == 3
    # The holder leaves: its blocks go with it.
    await holder.runtime.shutdown()
    await until(lambda: router.index.tree_size((holder.id, 0)) == 0)
    await collect(router, request("r2", PROMPT))
    assert routed_to(workers, "r2") != [holder]
    await router.close()


async def test_per_request_weight_zero_ignores_the_cache():
    router, workers = await start_router(2, RouterConfig(router_mode="kv", router_seed=1))
    holder, other = workers
    await holder.publish_stored(HASHES)
    await until(lambda: router.index.tree_size((holder.id, 0)) == 4)
    # The holder is already loaded with a request in flight.
    holder.release.clear()
    first = asyncio.create_task(collect(router, request("busy", PROMPT)))
    await until(lambda: len(holder.requests) == 1)
    # Weight 0: only decode load counts, so the idle worker wins despite no cache.
    await collect(router, request("w0", PROMPT, routing=RoutingHints(overlap_weight=0.0)))
    assert routed_to(workers, "w0") == [other]
    holder.release.set()
    await first
    await router.close()


async def test_gap_in_events_is_repaired_from_the_workers_state():
    router, workers = await start_router(2, RouterConfig(router_mode="kv"))
    w = workers[0]
    await until(lambda: w.state_calls >= 1)  # the state is fetched on discovery
    await w.publish_stored(HASHES[:1], event_id=1)
    await until(lambda: router.index.tree_size((w.id, 0)) == 1)
    calls = w.state_calls
    # Events 2..4 are lost; the worker's state says it holds 3 blocks.
    w.state = [KvEvent(worker_id=w.id, event_id=5, data=block_stored(HASHES[:3]))]
    await w.publish_stored(HASHES[3:], event_id=5)
    await until(lambda: w.state_calls == calls + 1)
    await until(lambda: router.index.tree_size((w.id, 0)) == 3)
    assert router.index.find_matches(HASHES) == {(w.id, 0): 3}
    await w.publish_stored(HASHES[3:], event_id=6)
    await until(lambda: router.index.tree_size((w.id, 0)) == 4)
    await router.close()


async def test_worker_that_cannot_send_its_state_is_never_asked_for_it():
    # vLLM's card: no KV state dump. Discovery and a gap in the events fetch nothing; the
    # index keeps what it knew and goes on from the event after the gap.
    router, workers = await start_router(
        1, RouterConfig(router_mode="kv"), kv_state_available=False
    )
    w = workers[0]
    await w.publish_stored(HASHES[:2], event_id=1)
    await until(lambda: router.index.tree_size((w.id, 0)) == 2)
    await w.publish_stored(HASHES[2:3], event_id=5)  # events 2..4 lost
    await until(lambda: router.index.tree_size((w.id, 0)) == 3)
    await w.publish_stored(HASHES[3:], event_id=6)
    await until(lambda: router.index.tree_size((w.id, 0)) == 4)
    assert router.index.find_matches(HASHES) == {(w.id, 0): 4}
    assert router.feed.sync.gaps == 1
    assert w.state_calls == 0
    assert router.metrics.kv_resyncs._value.get() == 0
    await router.close()


async def test_prompt_embeddings_are_booked_by_their_rows():
    router, workers = await start_router(1, RouterConfig(router_mode="least-loaded"))
    w = workers[0]
    w.release.clear()
    embeds = request("e", [], prompt_embeds=bytes(64), prompt_embeds_shape=[8, 2])
    embeds.prompt_embeds_dtype = "float32"
    task = asyncio.create_task(collect(router, embeds))
    await until(lambda: len(w.requests) == 1)
    assert router.load.load((w.id, 0)).prefill_tokens == 8
    w.release.set()
    assert (await task)[-1].finish_reason == "length"
    await router.close()


def block_stored(hashes):
    from stator.protocols import BlockStored

    return BlockStored(block_hashes=hashes, block_size=BS)


async def test_approximate_mode_sends_a_repeated_prompt_back():
    router, workers = await start_router(
        4, RouterConfig(router_mode="kv", router_kv_events=False, router_seed=3)
    )
    await collect(router, request("r1", PROMPT))
    first = routed_to(workers, "r1")
    for i in range(3):
        await collect(router, request(f"again{i}", PROMPT))
        assert routed_to(workers, f"again{i}") == first
    assert router.feed is None and len(router.approx) == 4
    await router.close()


async def test_all_busy_rejects_with_overloaded():
    config = RouterConfig(router_mode="round-robin", active_prefill_tokens_threshold=0)
    router, workers = await start_router(1, config)
    workers[0].release.clear()
    stuck = asyncio.create_task(collect(router, request("a", [1, 2, 3])))
    await until(lambda: len(workers[0].requests) == 1)
    with pytest.raises(Overloaded) as err:
        await collect(router, request("b", [1]))
    assert err.value.retry_after > 0
    assert router.rejected == 1
    assert router.metrics.rejections.labels("m")._value.get() == 1
    workers[0].release.set()
    await stuck
    await router.close()


async def test_queue_waits_for_load_to_drop_and_then_rejects_when_full():
    config = RouterConfig(
        router_mode="round-robin", active_prefill_tokens_threshold=0, router_queue_size=1
    )
    router, workers = await start_router(1, config)
    workers[0].release.clear()
    stuck = asyncio.create_task(collect(router, request("a", [1, 2, 3])))
    await until(lambda: len(workers[0].requests) == 1)
    queued = asyncio.create_task(collect(router, request("b", [1])))
    await until(lambda: len(router.queue) == 1)
    with pytest.raises(Overloaded):
        await collect(router, request("c", [1]))
    workers[0].release.set()  # "a" gets its first token: prefill load drops
    await asyncio.wait_for(stuck, 5)
    outs = await asyncio.wait_for(queued, 5)
    assert outs[-1].finish_reason == "length"
    assert len(router.queue) == 0
    await router.close()


async def test_queue_timeout_rejects():
    config = RouterConfig(
        router_mode="round-robin",
        active_prefill_tokens_threshold=0,
        router_queue_size=4,
        router_queue_timeout=0.2,
    )
    router, workers = await start_router(1, config)
    workers[0].release.clear()
    stuck = asyncio.create_task(collect(router, request("a", [1, 2, 3])))
    await until(lambda: len(workers[0].requests) == 1)
    with pytest.raises(Overloaded):
        await collect(router, request("b", [1]))
    workers[0].release.set()
    await stuck
    await router.close()


async def test_busy_threshold_api():
    router, _workers = await start_router(1, RouterConfig())
    assert router.busy_thresholds() == {
        "active_decode_blocks_threshold": None,
        "active_prefill_tokens_threshold": None,
    }
    router.set_busy_thresholds(active_decode_blocks_threshold=0.5)
    assert router.set_busy_thresholds(active_prefill_tokens_threshold=100) == {
        "active_decode_blocks_threshold": 0.5,
        "active_prefill_tokens_threshold": 100,
    }
    with pytest.raises(ValueError):
        router.set_busy_thresholds(active_decode_blocks_threshold=2.0)
    assert router.busy_thresholds()["active_decode_blocks_threshold"] == 0.5
    router.set_busy_thresholds(active_decode_blocks_threshold=None)
    assert router.busy_thresholds()["active_decode_blocks_threshold"] is None
    await router.close()


async def test_load_reports_make_a_worker_busy():
    config = RouterConfig(router_mode="round-robin", active_decode_blocks_threshold=0.5)
    router, workers = await start_router(2, config)
    full, spare = workers
    await full.report(active_kv_blocks=90, total_kv_blocks=100)
    await until(lambda: router.load.load((full.id, 0)).active_blocks == 90)
    for i in range(3):
        await collect(router, request(f"r{i}", [1]))
    assert not full.requests and len(spare.requests) == 3
    await router.close()


async def test_replicas_see_each_others_load():
    from prometheus_client import CollectorRegistry

    from stator.protocols import EngineOutput, ModelCard
    from stator.router import Router
    from stator.runtime import Runtime, RuntimeConfig
    from tests.router.fleet import GENERATE

    config = RouterConfig(router_mode="least-loaded", router_replica_sync=True)
    router_a, workers = await start_router(2, config)
    runtime_b = await Runtime.create(RuntimeConfig(discovery="mem"))
    client_b = await runtime_b.client(GENERATE, EngineOutput)
    await client_b.wait_for_instances(2, timeout=5)
    card = ModelCard(name="m", source_path="", kv_block_size=BS, total_kv_blocks=100)
    router_b = Router(runtime_b, client_b, card, config, registry=CollectorRegistry())
    await router_b.start()
    for w in workers:
        w.release.clear()
    first = asyncio.create_task(collect(router_a, request("a", [1, 2, 3])))
    await until(lambda: sum(len(w.requests) for w in workers) == 1)
    target = routed_to(workers, "a")[0]
    await until(lambda: router_b.load.load((target.id, 0)).inflight == 1)
    second = asyncio.create_task(collect(router_b, request("b", [1])))
    await until(lambda: sum(len(w.requests) for w in workers) == 2)
    assert routed_to(workers, "b") != [target]
    for w in workers:
        w.release.set()
    await first
    await second
    await until(lambda: router_b.load.load((target.id, 0)).inflight == 0)
    await router_a.close()
    await router_b.close()


async def test_worker_without_admin_endpoint_is_still_indexed_from_events():
    from prometheus_client import CollectorRegistry

    from stator.protocols import EngineOutput, ModelCard
    from stator.router import Router
    from stator.runtime import Runtime, RuntimeConfig
    from tests.router.fleet import GENERATE, start_worker

    worker = await start_worker(admin=False)
    frontend = await Runtime.create(RuntimeConfig(discovery="mem"))
    client = await frontend.client(GENERATE, EngineOutput)
    await client.wait_for_instances(1, timeout=5)
    card = ModelCard(name="m", source_path="", kv_block_size=BS)
    router = Router(
        frontend, client, card, RouterConfig(router_mode="kv"), registry=CollectorRegistry()
    )
    router.feed.retry_delay = 0.01
    await router.start()
    await worker.publish_stored(HASHES[:2], event_id=1)
    await until(lambda: router.index.tree_size((worker.id, 0)) == 2)
    # Events from an instance the client does not know are not indexed.
    from stator.protocols import BlockStored, KvEventBatch

    stranger = KvEvent(
        worker_id=999, event_id=1, data=BlockStored(block_hashes=HASHES, block_size=BS)
    )
    await worker.runtime.publish("kv_events", KvEventBatch(events=[stranger]))
    await worker.publish_stored(HASHES[2:3], event_id=2)
    await until(lambda: router.index.tree_size((worker.id, 0)) == 3)
    assert router.index.tree_size((999, 0)) == 0
    await router.close()


async def test_data_parallel_rank_is_chosen_and_passed_on():
    router, workers = await start_router(
        1, RouterConfig(router_mode="least-loaded"), data_parallel_size=2
    )
    assert router.candidates() == [(workers[0].id, 0), (workers[0].id, 1)]
    workers[0].release.clear()
    first = asyncio.create_task(collect(router, request("a", [1])))
    await until(lambda: len(workers[0].requests) == 1)
    second = asyncio.create_task(collect(router, request("b", [1])))
    await until(lambda: len(workers[0].requests) == 2)
    ranks = sorted(r.routing.dp_rank for r in workers[0].requests)
    assert ranks == [0, 1]
    workers[0].release.set()
    await first
    await second
    await router.close()


async def test_priority_queue_serves_the_higher_priority_first():
    config = RouterConfig(
        router_mode="round-robin",
        active_prefill_tokens_threshold=0,
        router_queue_size=4,
        router_queue_policy="priority",
    )
    router, workers = await start_router(1, config)
    w = workers[0]
    w.release.clear()
    stuck = asyncio.create_task(collect(router, request("a", [1, 2, 3])))
    await until(lambda: len(w.requests) == 1)
    low = asyncio.create_task(collect(router, request("low", [1, 2], priority=0)))
    await until(lambda: len(router.queue) == 1)
    high = asyncio.create_task(collect(router, request("high", [1, 2], priority=5)))
    await until(lambda: len(router.queue) == 2)
    w.release.set()
    await asyncio.wait_for(asyncio.gather(stuck, low, high), 10)
    order = [r.request_id for r in w.requests]
    assert order == ["a", "high", "low"]
    assert router.metrics.queue_length.labels("m")._value.get() == 0
    await router.close()
