"""The runtime across real processes: echo servers (`echo_server.py`) and a caller (this
test) meet through `file:` discovery + ZMQ events, or real etcd + NATS."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import pytest

from stator.runtime import Runtime, RuntimeConfig
from tests.runtime.cluster import EchoProcess, etcd_server, nats_server

pytestmark = pytest.mark.integration

TTL = 2.0
ENDPOINT = "test.echo.generate"


@pytest.fixture(params=["file+zmq", "etcd+nats"])
def planes(request, tmp_path):
    """(discovery url, event plane url) with their servers running."""
    with contextlib.ExitStack() as stack:
        if request.param == "file+zmq":
            yield f"file:{tmp_path / 'discovery'}", "zmq"
        else:
            etcd = stack.enter_context(etcd_server(tmp_path))
            nats = stack.enter_context(nats_server(tmp_path))
            yield f"etcd://{etcd}", nats


@pytest.fixture
def spawn(planes, tmp_path):
    procs: list[EchoProcess] = []

    def start(count: int = 1, grace: float = 30.0) -> list[EchoProcess]:
        new = [EchoProcess(*planes, tmp_path, ttl=TTL, grace=grace) for _ in range(count)]
        for p in new:
            p.wait_ready()
        procs.extend(new)
        return new

    yield start
    for p in procs:
        p.kill()


@pytest.fixture
async def caller(planes):
    config = RuntimeConfig(
        discovery=planes[0], discovery_ttl=TTL, request_plane="tcp", event_plane=planes[1]
    )
    runtime = await Runtime.create(config)
    yield runtime
    await runtime.shutdown()


async def _stream(client, instance_id, n, delay=0.0, tag="t"):
    return [x async for x in client.generate(instance_id, {"n": n, "delay": delay, "tag": tag})]


async def _until(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what} not within {timeout}s"
        await asyncio.sleep(0.05)


async def test_processes_find_each_other_and_survive_a_kill(spawn, caller):
    a, b = spawn(2)
    client = await caller.client(ENDPOINT, dict)
    ids = await client.wait_for_instances(2, timeout=30)
    assert sorted(ids) == sorted([a.instance_id, b.instance_id])
    for proc in (a, b):
        out = await _stream(client, proc.instance_id, 3)
        assert out == [{"i": i, "pid": proc.pid} for i in range(3)]

    # The event plane works across the processes too.
    seen: set[int] = set()

    async def listen():
        async for event in caller.subscribe("load"):
            seen.add(event["pid"])
            if seen == {a.pid, b.pid}:
                return

    await asyncio.wait_for(listen(), 30)

    a.proc.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    await _until(lambda: a.instance_id not in client.instances, TTL + 10, "expiry")
    gone_after = time.monotonic() - killed
    assert gone_after <= TTL + 3.0, f"removed after {gone_after:.1f}s, TTL {TTL}s"
    assert client.instance_ids() == [b.instance_id]
    out = await _stream(client, b.instance_id, 3)
    assert [x["i"] for x in out] == [0, 1, 2]


async def test_sigterm_drains_an_inflight_stream(spawn, caller):
    (proc,) = spawn(1)
    client = await caller.client(ENDPOINT, dict)
    await client.wait_for_instances(1, timeout=30)
    stream = client.generate(proc.instance_id, {"n": 10, "delay": 0.2, "tag": "drain"})
    got = [await anext(stream)]
    proc.proc.send_signal(signal.SIGTERM)
    # Unregistered first: the instance leaves discovery while its stream still runs.
    await _until(lambda: proc.instance_id not in client.instances, 10, "unregister")
    got += [x async for x in stream]
    assert [x["i"] for x in got] == list(range(10))
    assert await asyncio.to_thread(proc.proc.wait, 30) == 0
    assert proc.marker("drain") == "done"


async def test_closing_a_stream_runs_the_handlers_cleanup(spawn, caller):
    (proc,) = spawn(1)
    client = await caller.client(ENDPOINT, dict)
    await client.wait_for_instances(1, timeout=30)
    stream = client.generate(proc.instance_id, {"n": 100000, "delay": 0.01, "tag": "cancel"})
    assert (await anext(stream))["i"] == 0
    assert (await anext(stream))["i"] == 1
    await stream.aclose()
    await _until(lambda: proc.marker("cancel") is not None, 10, "cleanup")
    assert proc.marker("cancel") == "closed"


async def test_a_fatal_error_unregisters_and_exits_nonzero(spawn, caller):
    (proc,) = spawn(1)
    client = await caller.client(ENDPOINT, dict)
    await client.wait_for_instances(1, timeout=30)
    fatal = await caller.client("test.echo.fatal", dict)
    await fatal.wait_for_instances(1, timeout=30)
    with contextlib.suppress(Exception):  # the process may die before the reply is out
        await fatal.call(proc.instance_id, {})
    assert await asyncio.to_thread(proc.proc.wait, 30) == 1
    # Removed at once (unregistered), not after the TTL.
    await _until(lambda: proc.instance_id not in client.instances, TTL, "unregister")
    assert os.path.exists(proc.log_path)
