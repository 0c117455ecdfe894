"""`stator worker` as a real process on `file:` discovery and the TCP request plane."""

import asyncio
import importlib.util
import signal
import subprocess

import pytest

from stator.protocols import EngineOutput, EngineRequest, ModelCard, decode
from stator.runtime import Runtime, RuntimeConfig
from stator.runtime.names import models_prefix
from tests.procs import stator_process

NEEDS = (
    "stator.runtime.request_plane.tcp",
    "stator.runtime.discovery.file",
    "stator.runtime.event_plane.zmq",
)
missing = [m for m in NEEDS if importlib.util.find_spec(m) is None]

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(missing), reason=f"runtime backends not here yet: {missing}"),
]


async def wait_until(check, timeout: float, what: str):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        result = await check()
        if result:
            return result
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


async def test_worker_process_registers_serves_and_drains_on_sigterm(tmp_path, tiny_model_dir):
    discovery = f"file:{tmp_path / 'discovery'}"
    proc = stator_process(
        "worker",
        "--engine",
        "tests.worker.scripted_factory:create",
        "--token-delay",
        "0.05",
        "--model",
        str(tiny_model_dir),
        "--served-model-name",
        "scripted-tiny",
        "--discovery",
        discovery,
        "--discovery-ttl",
        "3",
        "--graceful-shutdown-timeout",
        "20",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    caller = await Runtime.create(RuntimeConfig(discovery=discovery))
    try:
        client = await caller.client("stator.backend.generate", EngineOutput)
        (worker_id,) = await client.wait_for_instances(1, timeout=90)

        async def card():
            entries = await caller.discovery.get_prefix(models_prefix())
            return [decode(v, ModelCard) for v in entries.values()]

        (published,) = await wait_until(card, 30, "the model card")
        assert published.name == "scripted-tiny"
        assert "tokenizer.json" in published.files

        req = EngineRequest(request_id="p1", model="scripted-tiny", token_ids=[4, 5, 6])
        outs = [o async for o in client.generate(worker_id, req)]
        assert [t for o in outs for t in o.token_ids] == [4, 5, 6]

        # SIGTERM while a stream is in flight: it finishes, then the worker exits 0.
        long_req = EngineRequest(request_id="p2", model="scripted-tiny", token_ids=list(range(30)))
        stream = client.generate(worker_id, long_req)
        first = await stream.__anext__()
        proc.send_signal(signal.SIGTERM)
        rest = [o async for o in stream]
        tokens = [t for o in [first, *rest] for t in o.token_ids]
        assert tokens == list(range(30))
        assert rest[-1].finish_reason == "stop"
        code = await asyncio.get_running_loop().run_in_executor(None, proc.wait, 60)
        output = proc.stdout.read()
        assert code == 0, output
        assert "draining" in output
        await wait_until(lambda: _empty(card), 10, "the card to go")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await caller.shutdown()


async def _empty(card):
    return not await card()
