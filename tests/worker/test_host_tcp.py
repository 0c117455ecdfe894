"""The worker host over the TCP request plane (one process, mem discovery): requests and
admin answers survive serialization, and a caller closing its stream reaches `abort`."""

import asyncio
import importlib.util

import pytest

from stator.protocols import (
    AdminRequest,
    AdminResponse,
    EngineOutput,
    EngineRequest,
    StopConditions,
)
from stator.runtime import Runtime, RuntimeConfig
from stator.worker.config import WorkerConfig
from stator.worker.host import WorkerHost
from tests.fakes import ScriptedEngine

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("stator.runtime.request_plane.tcp") is None,
    reason="TCP request plane not here yet",
)


async def test_generate_admin_and_abort_over_tcp():
    config = RuntimeConfig(discovery="mem", request_plane="tcp", event_plane="inproc")
    runtime = await Runtime.create(config)
    engine = ScriptedEngine("m", script=list(range(50)), delay=0.02)
    host = WorkerHost(runtime, engine, WorkerConfig(health_check_interval=0))
    await host.start()
    caller = await Runtime.create(config)
    client = await caller.client(host.endpoint, EngineOutput)
    (wid,) = await client.wait_for_instances(1, timeout=5)

    req = EngineRequest(
        request_id="t1", model="m", token_ids=[1], stop=StopConditions(max_tokens=3)
    )
    outs = [o async for o in client.generate(wid, req)]
    assert [t for o in outs for t in o.token_ids] == [0, 1, 2]
    assert outs[-1].finish_reason == "length"

    stream = client.generate(wid, EngineRequest(request_id="t2", model="m", token_ids=[1]))
    await stream.__anext__()
    await stream.aclose()
    for _ in range(200):
        if engine.aborted:
            break
        await asyncio.sleep(0.01)
    assert engine.aborted == ["t2"]

    admin = await caller.client(host.admin_endpoint, AdminResponse)
    await admin.wait_for_instances(1, timeout=5)
    (resp,) = await admin.call(wid, AdminRequest(op="clear_kv"))
    assert not resp.ok and "cannot clear" in resp.error
    (resp,) = await admin.call(wid, AdminRequest(op="list_loras"))
    assert resp.ok and resp.result == []

    await host.stop(grace=1)
    await caller.shutdown()
    await runtime.shutdown()
