"""`serve_worker`, the process runner of `stator worker`, in this process (mem discovery):
SIGTERM drains and returns 0; a dead engine returns 1."""

import asyncio
import os
import signal

from stator.protocols import EngineOutput, EngineRequest
from stator.runtime import Runtime, RuntimeConfig
from stator.runtime.lifecycle import EXIT_FATAL, EXIT_OK
from stator.worker.config import WorkerConfig
from stator.worker.main import serve_worker
from tests.fakes import ScriptedEngine


async def test_sigterm_drains_the_inflight_stream_then_returns_0():
    engine = ScriptedEngine("m", delay=0.01)
    config = RuntimeConfig(discovery="mem", graceful_shutdown_timeout=10)
    worker = asyncio.create_task(
        serve_worker(config, WorkerConfig(health_check_interval=0), engine)
    )
    caller = await Runtime.create(RuntimeConfig(discovery="mem"))
    client = await caller.client("stator.backend.generate")
    (wid,) = await client.wait_for_instances(1, timeout=10)
    stream = client.generate(
        wid, EngineRequest(request_id="s", model="m", token_ids=list(range(40)))
    )
    first = await stream.__anext__()
    os.kill(os.getpid(), signal.SIGTERM)
    rest = [o async for o in stream]
    assert [t for o in [first, *rest] for t in o.token_ids] == list(range(40))
    assert await asyncio.wait_for(worker, 10) == EXIT_OK
    assert client.instance_ids() == []
    assert engine.aborted == []
    await caller.shutdown()


class BrokenEngine(ScriptedEngine):
    async def health_check(self) -> None:
        raise RuntimeError("GPU fell off the bus")

    async def generate(self, request):
        yield EngineOutput(token_ids=[1], finish_reason="stop")


async def test_a_failing_engine_makes_the_worker_return_1():
    config = RuntimeConfig(discovery="mem")
    worker_config = WorkerConfig(health_check_interval=0.05, health_check_timeout=1)
    code = await asyncio.wait_for(serve_worker(config, worker_config, BrokenEngine("m")), 10)
    assert code == EXIT_FATAL


class UnstartableEngine(ScriptedEngine):
    async def start(self) -> None:
        raise RuntimeError("out of memory")


async def test_an_engine_that_cannot_start_returns_1():
    code = await serve_worker(RuntimeConfig(discovery="mem"), WorkerConfig(), UnstartableEngine())
    assert code == EXIT_FATAL
