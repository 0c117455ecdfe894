import asyncio

import pytest

from stator.runtime.discovery import MemDiscovery
from stator.runtime.errors import EventPlaneUnavailable
from stator.runtime.event_plane import open_event_plane
from stator.runtime.event_plane.nats import NatsEventPlane, wildcard_for_prefix
from tests.procs import free_port
from tests.runtime.cluster import nats_server


def test_wildcard_covers_the_prefix():
    assert wildcard_for_prefix("ns.load") == "ns.>"
    assert wildcard_for_prefix("ns.kv.") == "ns.kv.>"
    assert wildcard_for_prefix("ns") == ">"


async def test_unreachable_nats_is_a_clear_error():
    url = f"nats://127.0.0.1:{free_port()}"
    plane = NatsEventPlane(url, connect_timeout=1.0)
    with pytest.raises(EventPlaneUnavailable, match=url):
        await plane.start()


@pytest.mark.integration
async def test_publish_subscribe_through_nats(tmp_path):
    with nats_server(tmp_path) as url:
        disc = MemDiscovery("n")
        a = open_event_plane(url, discovery=disc, namespace="ns")
        b = open_event_plane(url, discovery=disc, namespace="ns")
        await a.start()
        await b.start()
        got = []

        async def sub():
            async for item in b.subscribe("ns.lo"):
                got.append(item)
                if len(got) == 2:
                    return

        task = asyncio.create_task(sub())
        while not b._nc or not b._nc._subs:
            await asyncio.sleep(0.01)
        await b._nc.flush()
        await a.publish("ns.load", b"1")
        await a.publish("ns.kv_events", b"x")
        await a.publish("other.load", b"y")
        await a.publish("ns.lo.x", b"2")
        await asyncio.wait_for(task, 10)
        assert got == [("ns.load", b"1"), ("ns.lo.x", b"2")]
        await a.close()
        await b.close()
