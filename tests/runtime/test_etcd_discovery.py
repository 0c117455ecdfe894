import asyncio
import time

import pytest

from stator.runtime.discovery import open_discovery
from stator.runtime.discovery.etcd import EtcdDiscovery, prefix_range_end
from stator.runtime.errors import DiscoveryUnavailable
from tests.procs import free_port
from tests.runtime.cluster import etcd_server


def test_prefix_range_end():
    assert prefix_range_end(b"v1/a/") == b"v1/a0"
    assert prefix_range_end(b"a\xff") == b"b"
    assert prefix_range_end(b"") == b"\0"


async def test_unreachable_etcd_is_a_clear_error():
    port = free_port()
    disc = open_discovery(f"etcd://127.0.0.1:{port}", ttl=2)
    with pytest.raises(DiscoveryUnavailable, match=f"127.0.0.1:{port}"):
        await disc.start()
    await disc.close()


@pytest.fixture
def etcd(tmp_path):
    with etcd_server(tmp_path) as address:
        yield address


async def _until(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not await cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


@pytest.mark.integration
async def test_keys_leases_and_watch(etcd):
    a = EtcdDiscovery(etcd, ttl=2)
    b = EtcdDiscovery(etcd, ttl=2)
    await a.start()
    await b.start()
    assert a.lease_id != b.lease_id and 0 < a.lease_id < 2**63
    await a.put("v1/x/one", b"1")
    events = []

    async def watch():
        async for event in b.watch("v1/x/"):
            events.append((event.kind, event.key, event.value))

    task = asyncio.create_task(watch())
    await a.put("v1/x/two", b"2")
    await a.put("v1/y/other", b"o")
    await b.delete("v1/x/one")
    assert await b.get_prefix("v1/") == {"v1/x/two": b"2", "v1/y/other": b"o"}

    async def three_events():
        return len(events) >= 3

    await _until(three_events)
    assert events == [
        ("put", "v1/x/one", b"1"),
        ("put", "v1/x/two", b"2"),
        ("delete", "v1/x/one", b""),
    ]
    await a.close()  # revokes the lease: its keys go at once
    assert await b.get_prefix("v1/") == {}
    await _until(three_events)
    await b.close()
    await asyncio.wait_for(task, 5)
    assert events[-1] == ("delete", "v1/x/two", b"")


@pytest.mark.integration
async def test_keys_of_a_dead_owner_expire_and_a_lost_lease_comes_back(etcd):
    owner = EtcdDiscovery(etcd, ttl=2)
    reader = EtcdDiscovery(etcd, ttl=2)
    await owner.put("k/a", b"1")
    owner._keepalive.cancel()  # as if the process froze or died: no more keep-alives
    start = time.monotonic()

    async def gone():
        return await reader.get_prefix("k/") == {}

    await _until(gone, timeout=10)
    assert time.monotonic() - start <= 2 + 2.0

    survivor = EtcdDiscovery(etcd, ttl=2)
    await survivor.put("k/b", b"2")
    await reader._post("/v3/lease/revoke", {"ID": str(survivor.lease_id)})

    async def back():
        return await reader.get_prefix("k/") == {"k/b": b"2"}

    await _until(back, timeout=10)
    await survivor.close()
    owner._closed.set()
    await owner._session.close()
    await reader.close()
