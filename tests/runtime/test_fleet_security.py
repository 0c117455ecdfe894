"""Who may talk to a worker: the fleet-secret handshake and mutual TLS on the TCP
request plane, private discovery files, and a refused connection marking an instance down."""

from __future__ import annotations

import asyncio
import os
import stat

import pytest

from stator.runtime import Runtime, RuntimeConfig
from stator.runtime.errors import ConnectionRefused, Migratable
from stator.runtime.request_plane.frames import FrameWriter
from stator.runtime.request_plane.tcp import TcpClient, TcpServer, split_address
from stator.runtime.security import FleetSecurity, Handshake, HandshakeFailed
from tests.certs import make_certs

ENDPOINT = "stator.backend.admin"


async def echo(request):
    yield {"echo": request}


async def serve(security: FleetSecurity | None) -> TcpServer:
    server = TcpServer("127.0.0.1", 0, security=security)
    await server.start()
    server.register(ENDPOINT, echo, object)
    return server


async def call(client: TcpClient, server: TcpServer, payload="clear_kv"):
    return [x async for x in client.stream(server.address, ENDPOINT, payload, object)]


def test_handshake_proves_the_secret_both_ways():
    server, client = Handshake(b"s3cret", server=True), Handshake(b"s3cret", server=False)
    to_server, rest = client.feed(server.greeting())
    assert not rest and not client.done
    to_client, rest = server.feed(to_server + b"frames")
    assert server.done and rest == b"frames"
    _, rest = client.feed(to_client + b"more")
    assert client.done and rest == b"more"
    liar = Handshake(b"guess", server=False)
    fresh = Handshake(b"s3cret", server=True)
    with pytest.raises(HandshakeFailed):
        fresh.feed(liar.feed(fresh.greeting())[0])


async def test_secret_on_both_sides_serves_and_a_stranger_is_refused():
    security = FleetSecurity.build(secret="s3cret")
    server = await serve(security)
    try:
        good = TcpClient(security=security)
        assert await call(good, server) == [{"echo": "clear_kv"}]
        await good.close()
        for other in (FleetSecurity.build(secret="wrong"), None):
            stranger = TcpClient(security=other, connect_timeout=2)
            with pytest.raises(Migratable):  # CannotConnect, or cut off mid-stream
                await asyncio.wait_for(call(stranger, server), 10)
            await stranger.close()
    finally:
        await server.stop()


async def test_raw_frames_without_the_handshake_get_nothing():
    # Was: `clear_kv` and `kv_state` answered from a plain socket.
    server = await serve(FleetSecurity.build(secret="s3cret"))
    try:
        host, port = split_address(server.address)
        reader, writer = await asyncio.open_connection(host, port)
        frames = FrameWriter()
        frames.add((1, 1, ENDPOINT, "clear_kv"))  # a REQUEST frame
        writer.write(bytes(frames.take()))
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)  # the server closes on us
        assert b"clear_kv" not in data and b"echo" not in data
        writer.close()
    finally:
        await server.stop()


async def test_mutual_tls_admits_only_the_fleets_certificates(tmp_path):
    certs = make_certs(tmp_path)

    def tls(pair) -> FleetSecurity:
        return FleetSecurity.build(
            tls_cert=str(pair.cert), tls_key=str(pair.key), tls_ca=str(certs.ca)
        )

    server = await serve(tls(certs.server))
    try:
        member = TcpClient(security=tls(certs.client))
        assert await call(member, server) == [{"echo": "clear_kv"}]
        await member.close()
        for outsider in (tls(certs.stranger), None):
            client = TcpClient(security=outsider, connect_timeout=3)
            with pytest.raises((Migratable, OSError)):  # TLS 1.3 refuses after connecting
                await asyncio.wait_for(call(client, server), 10)
            await client.close()
    finally:
        await server.stop()
    with pytest.raises(ValueError, match="needs all of"):
        FleetSecurity.build(tls_cert=str(certs.client.cert))


async def test_runtimes_with_the_same_secret_and_tls_talk(tmp_path):
    certs = make_certs(tmp_path)
    config = RuntimeConfig(
        discovery="mem:fleet-sec",
        request_plane="tcp",
        event_plane="inproc",
        fleet_secret="s3cret",
        fleet_tls_cert=str(certs.client.cert),
        fleet_tls_key=str(certs.client.key),
        fleet_tls_ca=str(certs.ca),
    )
    worker, caller = await Runtime.create(config), await Runtime.create(config)
    try:
        await worker.serve("stator.backend.admin", echo, object)
        client = await caller.client("stator.backend.admin", object)
        (iid,) = await client.wait_for_instances(1, timeout=5)
        assert await client.call(iid, "hi") == [{"echo": "hi"}]
    finally:
        await caller.shutdown()
        await worker.shutdown()


async def test_a_refused_connection_marks_the_instance_down_at_once():
    config = RuntimeConfig(discovery="mem:refused", request_plane="tcp", event_plane="inproc")
    worker, caller = await Runtime.create(config), await Runtime.create(config)
    try:
        await worker.serve("stator.backend.admin", echo, object)
        client = await caller.client("stator.backend.admin", object)
        (iid,) = await client.wait_for_instances(1, timeout=5)
        # The worker's port closes (as when it is SIGKILLed) while its entry lives on.
        await worker._server.stop()  # type: ignore[union-attr]
        with pytest.raises(ConnectionRefused):
            await client.call(iid, "hi")
        assert client.instance_ids() == []
        client._back_up(iid)  # after the down period: tried again
        assert client.instance_ids() == [iid]
    finally:
        await caller.shutdown()
        await worker.shutdown()


async def test_discovery_files_are_private(tmp_path):
    from stator.runtime.discovery.file import FileDiscovery

    root = tmp_path / "disc"
    discovery = FileDiscovery(str(root), ttl=2)
    await discovery.start()
    try:
        await discovery.put("stator/instances/x", b"127.0.0.1:1234")
        assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
        for path in [*root.rglob("*")]:
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode & 0o077 == 0, (path, oct(mode))
    finally:
        await discovery.close()
