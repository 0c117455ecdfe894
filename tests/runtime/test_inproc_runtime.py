import asyncio

import pytest

from stator.protocols import EngineRequest
from stator.runtime import (
    EngineShutdown,
    NoInstances,
    RemoteError,
    Runtime,
    RuntimeConfig,
    StreamDisconnected,
)


async def make_runtime() -> Runtime:
    return await Runtime.create(RuntimeConfig(discovery="mem"))


async def test_client_sees_instances_come_and_go():
    worker = await make_runtime()
    caller = await make_runtime()
    client = await caller.client("stator.backend.generate")
    assert client.instance_ids() == []

    async def handler(request):
        yield request

    await worker.serve("stator.backend.generate", handler)
    assert await client.wait_for_instances(1, timeout=1) == [worker.instance_id]
    await worker.shutdown()
    await asyncio.sleep(0)
    assert client.instance_ids() == []
    with pytest.raises(NoInstances):
        await client.wait_for_instances(1, timeout=0.05)
    await caller.shutdown()


async def test_stream_and_typed_request_pass_through():
    worker = await make_runtime()

    async def handler(request: EngineRequest):
        for t in request.token_ids:
            yield t * 2

    await worker.serve("stator.backend.generate", handler, EngineRequest)
    client = await worker.client("stator.backend.generate")
    await client.wait_for_instances(1, timeout=1)
    req = EngineRequest(request_id="r1", model="m", token_ids=[1, 2, 3])
    out = [x async for x in client.generate(worker.instance_id, req)]
    assert out == [2, 4, 6]
    await worker.shutdown()


async def test_closing_the_stream_runs_the_handlers_cleanup():
    worker = await make_runtime()
    cleaned = asyncio.Event()

    async def handler(request):
        try:
            for i in range(1000):
                yield i
                await asyncio.sleep(0)
        finally:
            cleaned.set()

    await worker.serve("stator.backend.generate", handler)
    client = await worker.client("stator.backend.generate")
    await client.wait_for_instances(1, timeout=1)
    stream = client.generate(worker.instance_id, None)
    assert await stream.__anext__() == 0
    await stream.aclose()
    assert cleaned.is_set()
    await worker.shutdown()


async def test_handler_error_and_dead_instance():
    worker = await make_runtime()

    async def failing(request):
        yield 1
        raise ValueError("bad thing")

    async def slow(request):
        for i in range(100):
            yield i
            await asyncio.sleep(0.01)

    await worker.serve("stator.backend.fail", failing)
    await worker.serve("stator.backend.slow", slow)
    fail = await worker.client("stator.backend.fail")
    slow_client = await worker.client("stator.backend.slow")
    await fail.wait_for_instances(1, timeout=1)
    await slow_client.wait_for_instances(1, timeout=1)
    with pytest.raises(RemoteError, match="bad thing"):
        [x async for x in fail.generate(worker.instance_id, None)]

    got = []

    async def consume():
        async for x in slow_client.generate(worker.instance_id, None):
            got.append(x)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    await worker._server.stop()
    with pytest.raises(StreamDisconnected):
        await task
    assert 0 < len(got) < 100
    await worker.shutdown()


async def test_a_handler_giving_the_stream_up_is_migratable():
    worker = await make_runtime()

    async def dying(request):
        yield 1
        raise EngineShutdown("engine died")

    await worker.serve("stator.backend.generate", dying)
    client = await worker.client("stator.backend.generate")
    await client.wait_for_instances(1, timeout=1)
    with pytest.raises(EngineShutdown):
        [x async for x in client.generate(worker.instance_id, None)]
    await worker.shutdown()


async def test_drain_waits_for_inflight_streams():
    worker = await make_runtime()

    async def handler(request):
        for i in range(5):
            await asyncio.sleep(0.01)
            yield i

    await worker.serve("stator.backend.generate", handler)
    client = await worker.client("stator.backend.generate")
    await client.wait_for_instances(1, timeout=1)
    task = asyncio.create_task(_collect(client.generate(worker.instance_id, None)))
    await asyncio.sleep(0.005)
    assert await worker.drain(grace=2.0)
    assert await task == [0, 1, 2, 3, 4]
    assert client.instance_ids() == []
    await worker.shutdown()


async def test_events_inproc():
    a = await make_runtime()
    b = await make_runtime()
    got = []

    async def sub():
        async for obj in b.subscribe("load"):
            got.append(obj)
            if len(got) == 2:
                return

    task = asyncio.create_task(sub())
    await asyncio.sleep(0)
    await a.publish("load", {"x": 1})
    await a.publish("other", {"x": 9})
    await a.publish("load", {"x": 2})
    await asyncio.wait_for(task, 1)
    assert got == [{"x": 1}, {"x": 2}]
    await a.shutdown()
    await b.shutdown()


async def _collect(stream):
    return [x async for x in stream]
