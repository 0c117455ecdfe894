"""Router replicas: bookings shared between frontends, and those of a frontend that went
silent (crashed) released after the peer TTL."""

import asyncio

import pytest

from stator.router import RouterConfig
from stator.router.load import LoadTracker
from stator.router.replica_sync import ROUTER_LOAD_TOPIC, LoadSyncEvent, ReplicaSync
from tests.router.fleet import collect, request, start_router, until

K = (7, 0)


def add(router_id: int, rid: str, key=K) -> LoadSyncEvent:
    return LoadSyncEvent(
        router_id=router_id,
        model="m",
        kind="add",
        request_id=rid,
        worker_id=key[0],
        dp_rank=key[1],
        prefill_tokens=10,
        blocks=2,
    )


def test_a_silent_peers_bookings_are_released_after_the_ttl():
    tracker = LoadTracker()
    # The runtime is only used to publish, which this test never does.
    sync = ReplicaSync(None, "m", tracker, peer_ttl=5.0)  # type: ignore[arg-type]
    sync.apply(add(1, "a"), now=0.0)
    sync.apply(add(1, "b"), now=0.0)
    sync.apply(add(2, "c", key=(8, 0)), now=0.0)
    sync.apply(LoadSyncEvent(router_id=2, model="m", kind="alive"), now=4.0)
    assert tracker.load(K).inflight == 2 and tracker.load((8, 0)).inflight == 1
    assert sync.expire(now=4.0) == 0
    # Peer 1 last spoke at 0, peer 2 at 4.
    assert sync.expire(now=5.5) == 2
    assert (tracker.load(K).inflight, tracker.load(K).prefill_tokens) == (0, 0)
    assert tracker.load(K).active_blocks == 0
    assert tracker.load((8, 0)).inflight == 1 and sync.peers == [2]
    # A late finish from the expired peer is harmless; if it comes back it counts again.
    sync.apply(LoadSyncEvent(router_id=1, model="m", kind="finish", request_id="a"), now=6.0)
    sync.apply(add(1, "d"), now=6.0)
    assert tracker.load(K).inflight == 1 and sorted(sync.peers) == [1, 2]
    # A finished booking is not released twice.
    sync.apply(LoadSyncEvent(router_id=1, model="m", kind="finish", request_id="d"), now=7.0)
    assert sync.expire(now=20.0) == 1  # peer 2's "c"
    assert tracker.load((8, 0)).inflight == 0 and sync.peers == []


def test_own_and_other_models_events_are_ignored():
    tracker = LoadTracker()
    sync = ReplicaSync(None, "m", tracker, peer_ttl=1.0)  # type: ignore[arg-type]
    sync.apply(add(sync.router_id, "mine"), now=0.0)
    other = add(3, "x")
    other.model = "another"
    sync.apply(other, now=0.0)
    assert tracker.load(K).inflight == 0 and sync.peers == []


def test_ttl_must_be_positive():
    with pytest.raises(ValueError):
        ReplicaSync(None, "m", LoadTracker(), peer_ttl=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RouterConfig(router_replica_sync=True, router_replica_ttl=-1).validate()


async def test_a_crashed_frontends_load_expires_while_a_live_ones_stays():
    config = RouterConfig(
        router_mode="least-loaded", router_replica_sync=True, router_replica_ttl=0.3
    )
    router, workers = await start_router(1, config)
    key = (workers[0].id, 0)
    # A frontend that booked a request on the worker and then died: it never speaks again.
    crashed = add(12345, "lost", key=key)
    await router.runtime.publish(ROUTER_LOAD_TOPIC, crashed)
    await until(lambda: router.load.load(key).inflight == 1)
    await until(lambda: router.load.load(key).inflight == 0, timeout=10)
    assert 12345 not in router.replicas.peers

    # A live peer's long request stays booked well past the TTL: its heartbeats keep it.
    from prometheus_client import CollectorRegistry

    from stator.protocols import EngineOutput
    from stator.router import Router
    from stator.runtime import Runtime, RuntimeConfig
    from tests.router.fleet import GENERATE

    runtime_b = await Runtime.create(RuntimeConfig(discovery="mem"))
    client_b = await runtime_b.client(GENERATE, EngineOutput)
    await client_b.wait_for_instances(1, timeout=5)
    router_b = Router(runtime_b, client_b, router.card, config, registry=CollectorRegistry())
    await router_b.start()
    workers[0].release.clear()
    held = asyncio.create_task(collect(router_b, request("held", [1, 2, 3])))
    await until(lambda: router.load.load(key).inflight == 1)
    await asyncio.sleep(1.0)  # more than 3 TTLs
    assert router.load.load(key).inflight == 1
    workers[0].release.set()
    await held
    await until(lambda: router.load.load(key).inflight == 0)
    await router_b.close()
    await router.close()
