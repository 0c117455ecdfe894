import asyncio

from stator.runtime.discovery import MemDiscovery
from stator.runtime.event_plane.zmq import ZmqEventPlane


async def _collect(plane, prefix, count, got):
    async for item in plane.subscribe(prefix):
        got.append(item)
        if len(got) == count:
            return


async def _publish_until(plane, topic, payload, done: asyncio.Task):
    # PUB/SUB drops what is sent before the subscriber's connection is up: keep sending.
    while not done.done():
        await plane.publish(topic, payload)
        await asyncio.sleep(0.02)


async def test_subscribers_find_publishers_through_discovery():
    a_disc, b_disc = MemDiscovery("z"), MemDiscovery("z")
    a = ZmqEventPlane(a_disc, "ns")
    b = ZmqEventPlane(b_disc, "ns")
    await a.start()
    await b.start()
    got: list = []
    task = asyncio.create_task(_collect(b, "ns.load", 3, got))
    noise = asyncio.create_task(_publish_until(a, "ns.other", b"x", task))
    await _publish_until(a, "ns.load", b"1", task)
    await asyncio.wait_for(task, 10)
    await noise
    assert got == [("ns.load", b"1")] * 3
    await a.close()
    await b.close()


async def test_publisher_leaving_is_disconnected_and_close_ends_subscriptions():
    disc = MemDiscovery("z2")
    pub_disc = MemDiscovery("z2")
    pub = ZmqEventPlane(pub_disc, "ns")
    sub = ZmqEventPlane(disc, "ns")
    await pub.start()
    key = pub._key
    assert (await disc.get_prefix(key)) == {key: pub.address.encode()}
    got: list = []
    task = asyncio.create_task(_collect(sub, "ns.", 1000, got))
    await _publish_until_some(pub, got)
    await pub.close()
    await pub_disc.close()
    assert await disc.get_prefix(key) == {}
    await sub.close()
    await asyncio.wait_for(task, 5)  # the subscription ended without error


async def _publish_until_some(plane, got):
    for _ in range(500):
        await plane.publish("ns.kv", b"e")
        await asyncio.sleep(0.01)
        if got:
            return
    raise AssertionError("no event arrived")
