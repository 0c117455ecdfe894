"""Migration across real processes: two `stator worker --engine mocker` processes on `file:`
discovery and the TCP request plane; the one serving a stream is SIGKILLed mid-stream."""

import asyncio
import importlib.util
import signal
import subprocess

import pytest
from prometheus_client import CollectorRegistry

from stator.protocols import EngineOutput, EngineRequest, ModelCard, StopConditions
from stator.router import Router, RouterConfig
from stator.runtime import Runtime, RuntimeConfig, StreamDisconnected
from tests.procs import stator_process

NEEDS = (
    "stator.runtime.request_plane.tcp",
    "stator.runtime.discovery.file",
    "stator.runtime.event_plane.zmq",
    "stator.engines.mocker",
    "stator.worker",
)
missing = [m for m in NEEDS if importlib.util.find_spec(m) is None]

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(missing), reason=f"not here yet: {missing}"),
]

MAX_TOKENS = 40


def start_worker(discovery: str, model_dir) -> subprocess.Popen:
    # speedup 0.05: a decode step takes ~100 ms, so the stream is long enough to cut.
    return stator_process(
        "worker",
        "--engine",
        "mocker",
        "--model",
        str(model_dir),
        "--speedup-ratio",
        "0.05",
        "--discovery",
        discovery,
        "--discovery-ttl",
        "3",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def run_and_kill(tmp_path, model_dir, migration_limit: int):
    discovery = f"file:{tmp_path / 'discovery'}"
    procs: dict[int, subprocess.Popen] = {}
    caller = await Runtime.create(RuntimeConfig(discovery=discovery))
    router = None
    try:
        client = await caller.client("stator.backend.generate", EngineOutput)
        for n in (1, 2):
            proc = start_worker(discovery, model_dir)
            ids = await client.wait_for_instances(n, timeout=120)
            (new,) = set(ids) - set(procs)
            procs[new] = proc
        card = ModelCard(name="m", source_path=str(model_dir), kv_block_size=64)
        config = RouterConfig(router_mode="round-robin", migration_limit=migration_limit)
        router = Router(caller, client, card, config, registry=CollectorRegistry())
        await router.start()
        request = EngineRequest(
            request_id="r1",
            model="m",
            token_ids=list(range(1, 21)),
            stop=StopConditions(max_tokens=MAX_TOKENS, ignore_eos=True),
        )
        outputs: list[EngineOutput] = []
        killed = False
        async for out in router.generate(request):
            outputs.append(out)
            got = sum(len(o.token_ids) for o in outputs)
            if not killed and got >= 5:
                (booking,) = router.load.bookings.values()
                procs[booking.key[0]].send_signal(signal.SIGKILL)
                killed = True
        return outputs, router
    finally:
        if router is not None:
            await router.close()
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        await caller.shutdown()


async def test_sigkilled_worker_mid_stream_is_migrated(tmp_path, tiny_model_dir):
    outputs, router = await run_and_kill(tmp_path, tiny_model_dir, migration_limit=1)
    tokens = [t for o in outputs for t in o.token_ids]
    assert len(tokens) == MAX_TOKENS
    assert outputs[-1].finish_reason == "length"
    assert outputs[-1].usage.prompt_tokens == 20
    assert outputs[-1].usage.completion_tokens == MAX_TOKENS
    assert router.metrics.migrations.labels("m", "ongoing_request")._value.get() == 1


async def test_without_migration_the_failure_reaches_the_caller(tmp_path, tiny_model_dir):
    with pytest.raises(StreamDisconnected):
        await asyncio.wait_for(run_and_kill(tmp_path, tiny_model_dir, migration_limit=0), 180)
