import asyncio

import pytest

from stator.protocols import EngineOutput, EngineRequest
from stator.runtime import (
    CannotConnect,
    EndpointNotFound,
    EngineShutdown,
    RemoteError,
    Runtime,
    RuntimeConfig,
    StreamDisconnected,
)
from stator.runtime.request_plane.frames import ITEM, FrameReader, FrameWriter, Item
from stator.runtime.request_plane.tcp import TcpClient, TcpServer
from tests.procs import free_port


async def tcp_runtime() -> Runtime:
    return await Runtime.create(
        RuntimeConfig(discovery="mem", request_plane="tcp", event_plane="inproc")
    )


async def serve(handler, request_type=object, name="stator.backend.generate"):
    server = TcpServer("127.0.0.1", 0)
    await server.start()
    server.register(name, handler, request_type)
    return server


def test_frames_survive_any_chunking():
    writer = FrameWriter()
    for i in range(50):
        writer.add((ITEM, i, {"tokens": list(range(i))}))
    data = bytes(writer.take())
    got = []
    reader = FrameReader(got.append)
    for size in (1, 3, 7, 1000):
        got.clear()
        for start in range(0, len(data), size):
            reader.feed(data[start : start + size])
        assert [type(x) for x in got] == [Item] * 50
        assert [x.stream_id for x in got] == list(range(50))


def test_unencodable_frame_leaves_no_garbage():
    writer = FrameWriter()
    writer.add((ITEM, 1, "ok"))
    with pytest.raises(TypeError):
        writer.add((ITEM, 2, object()))
    got = []
    FrameReader(got.append).feed(bytes(writer.take()))
    assert [x.stream_id for x in got] == [1]


async def test_typed_stream_through_runtime():
    worker = await tcp_runtime()
    caller = await tcp_runtime()

    async def handler(request: EngineRequest):
        for t in request.token_ids:
            yield EngineOutput(token_ids=[t * 2])

    await worker.serve("stator.backend.generate", handler, EngineRequest)
    client = await caller.client("stator.backend.generate", EngineOutput)
    await client.wait_for_instances(1, timeout=5)
    req = EngineRequest(request_id="r1", model="m", token_ids=[1, 2, 3])
    out = [x async for x in client.generate(worker.instance_id, req)]
    assert out == [
        EngineOutput(token_ids=[2]),
        EngineOutput(token_ids=[4]),
        EngineOutput(token_ids=[6]),
    ]
    await caller.shutdown()
    await worker.shutdown()


async def test_many_concurrent_streams_share_one_connection():
    async def handler(n):
        for i in range(n):
            yield i
            await asyncio.sleep(0)

    server = await serve(handler)
    client = TcpClient()

    async def one(n):
        return [x async for x in client.stream(server.address, "stator.backend.generate", n, int)]

    results = await asyncio.gather(*(one(n) for n in range(100)))
    assert results == [list(range(n)) for n in range(100)]
    assert len(client._connections) == 1
    await client.close()
    await server.stop()


async def test_closing_a_stream_runs_the_handler_cleanup():
    cleaned = asyncio.Event()

    async def handler(_):
        try:
            i = 0
            while True:
                yield i
                i += 1
                await asyncio.sleep(0.001)
        finally:
            cleaned.set()

    server = await serve(handler)
    client = TcpClient()
    stream = client.stream(server.address, "stator.backend.generate", None, int)
    assert await stream.__anext__() == 0
    await stream.aclose()
    await asyncio.wait_for(cleaned.wait(), 5)
    for _ in range(100):
        if server.inflight == 0:
            break
        await asyncio.sleep(0.01)
    assert server.inflight == 0
    await client.close()
    await server.stop()


async def test_errors_are_classified():
    async def failing(_):
        yield 1
        raise ValueError("bad thing")

    server = await serve(failing, request_type=EngineRequest)
    client = TcpClient()
    addr = server.address
    req = EngineRequest(request_id="r", model="m", token_ids=[1])
    with pytest.raises(RemoteError, match="bad thing"):
        [x async for x in client.stream(addr, "stator.backend.generate", req, int)]
    with pytest.raises(RemoteError, match="bad request"):
        [x async for x in client.stream(addr, "stator.backend.generate", {"no": 1}, int)]
    with pytest.raises(EndpointNotFound):
        [x async for x in client.stream(addr, "stator.backend.nope", req, int)]
    with pytest.raises(RemoteError, match="undecodable response"):
        [x async for x in client.stream(addr, "stator.backend.generate", req, str)]
    server.unregister("stator.backend.generate")
    with pytest.raises(EngineShutdown):
        [x async for x in client.stream(addr, "stator.backend.generate", req, int)]
    await client.close()
    await server.stop()


async def test_a_handler_giving_the_stream_up_is_migratable():
    async def dying(_):
        yield 1
        raise EngineShutdown("engine died")

    server = await serve(dying, request_type=EngineRequest)
    client = TcpClient()
    req = EngineRequest(request_id="r", model="m", token_ids=[1])
    got = []
    with pytest.raises(EngineShutdown, match="engine died"):
        async for x in client.stream(server.address, "stator.backend.generate", req, int):
            got.append(x)
    assert got == [1]
    await client.close()
    await server.stop()


async def test_cannot_connect():
    client = TcpClient(connect_timeout=2)
    with pytest.raises(CannotConnect, match="cannot connect"):
        [x async for x in client.stream(f"127.0.0.1:{free_port()}", "a.b.c", None, int)]


async def test_server_stop_disconnects_open_streams():
    async def slow(_):
        for i in range(1000):
            yield i
            await asyncio.sleep(0.01)

    server = await serve(slow)
    client = TcpClient()
    got = []
    with pytest.raises(StreamDisconnected):
        async for x in client.stream(server.address, "stator.backend.generate", None, int):
            got.append(x)
            if len(got) == 3:
                await server.stop()
    assert len(got) >= 3
    await client.close()


async def test_silent_peer_is_detected_by_heartbeat():
    # A peer that accepts the connection and then never says anything (a host that froze).
    async def silent(reader, writer):
        await asyncio.sleep(30)

    srv = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    client = TcpClient(heartbeat_interval=0.05, dead_after=0.3)
    with pytest.raises(StreamDisconnected, match="lost connection"):
        await asyncio.wait_for(anext(client.stream(f"127.0.0.1:{port}", "a.b.c", None, int)), 10)
    srv.close()


async def test_dead_client_cancels_its_handlers():
    cleaned = asyncio.Event()

    async def handler(_):
        try:
            yield 0
            await asyncio.sleep(60)
        finally:
            cleaned.set()

    server = await serve(handler)
    client = TcpClient()
    stream = client.stream(server.address, "stator.backend.generate", None, int)
    assert await stream.__anext__() == 0
    for conn in client._connections.values():
        conn.abort()  # the caller's process dies: no cancel frame, just a dead socket
    await asyncio.wait_for(cleaned.wait(), 5)
    await server.stop()


async def test_drain_waits_for_a_tcp_stream():
    worker = await tcp_runtime()

    async def handler(_):
        for i in range(5):
            await asyncio.sleep(0.02)
            yield i

    await worker.serve("stator.backend.generate", handler)
    client = await worker.client("stator.backend.generate", int)
    await client.wait_for_instances(1, timeout=5)
    task = asyncio.create_task(_collect(client.generate(worker.instance_id, None)))
    while worker.inflight == 0:
        await asyncio.sleep(0.001)
    assert await worker.drain(grace=5.0)
    assert await task == [0, 1, 2, 3, 4]
    await worker.shutdown()


async def _collect(stream):
    return [x async for x in stream]


def test_stream_cancel_and_errors_on_uvloop():
    # Serving processes run on uvloop where it is installed; its transports differ.
    uvloop = pytest.importorskip("uvloop")

    async def scenario():
        await test_many_concurrent_streams_share_one_connection()
        await test_closing_a_stream_runs_the_handler_cleanup()
        await test_errors_are_classified()
        await test_server_stop_disconnects_open_streams()
        await test_dead_client_cancels_its_handlers()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(scenario())


async def test_garbage_from_a_peer_closes_only_its_connection():
    async def handler(n):
        yield n

    server = await serve(handler, request_type=int)
    host, port = server.address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"\xff\xff\xff\xff garbage")  # a 4 GiB frame: refused
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 5) == b""  # the server hung up
    writer.close()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"\x00\x00\x00\x02\xc1\xc1")  # a frame that is not msgpack
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    client = TcpClient()
    assert [x async for x in client.stream(server.address, "stator.backend.generate", 7, int)] == [
        7
    ]
    await client.close()
    await server.stop()


async def test_a_stream_on_a_connection_lost_meanwhile_fails_instead_of_hanging():
    async def handler(n):
        yield n

    server = await serve(handler, request_type=int)
    client = TcpClient()
    conn = await client._connection(server.address)
    conn.abort()
    await asyncio.sleep(0.05)
    assert conn.closed
    _, inbox = conn.open("stator.backend.generate", 1)
    assert list(inbox.frames) != []
    await client.close()
    await server.stop()
