import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import msgspec
import pytest

from stator.engines.base import EngineDead
from stator.logs import request_id_var
from stator.protocols import (
    AdminRequest,
    AdminResponse,
    AllCleared,
    BlockStored,
    EngineOutput,
    EngineRequest,
    KvEvent,
    KvEventBatch,
    LoadReport,
    LoraInfo,
    ModelCard,
    StopConditions,
    decode,
)
from stator.runtime import Runtime, RuntimeConfig
from stator.runtime.names import models_prefix
from stator.worker.config import WorkerConfig
from stator.worker.host import WorkerHost
from tests.fakes import ScriptedEngine

QUIET = {"health_check_interval": 0.0, "load_report_interval": 0.0}


class FullEngine(ScriptedEngine):
    """ScriptedEngine plus the optional hooks (KV events, clear, LoRA, sleep)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.events: asyncio.Queue[list[KvEvent]] = asyncio.Queue()
        self.cleared = 0
        self.loras: dict[str, LoraInfo] = {}
        self.request_ids_seen: list[str] = []
        self.started = False
        self.stopped = False

    async def start(self) -> None:
        self.started = True

    async def shutdown(self) -> None:
        self.stopped = True

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineOutput]:
        self.request_ids_seen.append(request_id_var.get())
        inner = super().generate(request)
        try:
            async for out in inner:
                yield out
        finally:
            await inner.aclose()

    async def kv_events(self) -> AsyncIterator[list[KvEvent]]:
        while True:
            yield await self.events.get()

    def kv_state(self) -> list[KvEvent]:
        return [KvEvent(worker_id=self.worker_id, event_id=7, data=BlockStored(block_hashes=[1]))]

    async def clear_kv(self) -> None:
        self.cleared += 1

    async def load_lora(self, name: str, path: str) -> LoraInfo:
        self.loras[name] = LoraInfo(name=name, path=path)
        return self.loras[name]

    async def unload_lora(self, name: str) -> None:
        del self.loras[name]

    def list_loras(self) -> list[LoraInfo]:
        return list(self.loras.values())


async def start_host(engine, tmp=None, **config) -> tuple[Runtime, WorkerHost]:
    runtime = await Runtime.create(RuntimeConfig(discovery="mem"))
    host = WorkerHost(runtime, engine, WorkerConfig(**{**QUIET, **config}), model_dir=tmp)
    await host.start()
    return runtime, host


async def cards(runtime: Runtime) -> list[ModelCard]:
    entries = await runtime.discovery.get_prefix(models_prefix())
    return [decode(v, ModelCard) for v in entries.values()]


async def test_card_is_published_with_operator_settings_and_removed_on_stop(tiny_model_dir):
    engine = FullEngine("tiny")
    runtime, host = await start_host(
        engine,
        tiny_model_dir,
        served_model_name="served",
        reasoning_parser="deepseek_r1",
        tool_call_parser="hermes",
        max_model_len=512,
        migration_limit=3,
    )
    assert engine.started and engine.worker_id == runtime.instance_id
    (card,) = await cards(runtime)
    assert card.name == "served"
    assert (card.reasoning_parser, card.tool_call_parser) == ("deepseek_r1", "hermes")
    assert (card.context_length, card.migration_limit) == (512, 3)
    assert card.source_path == str(tiny_model_dir)
    assert card.files["tokenizer.json"] == (tiny_model_dir / "tokenizer.json").read_bytes()
    assert "config.json" in card.files and "tokenizer_config.json" in card.files
    assert any(f.endswith("tokenizer.json") for f in card.tokenizer_files)
    assert await host.stop(grace=1)
    assert await cards(runtime) == []
    assert engine.stopped
    await runtime.shutdown()


async def test_generate_streams_and_sets_the_request_id():
    engine = FullEngine("m", script=[5, 6, 7])
    runtime, host = await start_host(engine)
    client = await runtime.client(host.endpoint)
    await client.wait_for_instances(1, timeout=2)
    req = EngineRequest(request_id="req-1", model="m", token_ids=[1, 2])
    outs = [o async for o in client.generate(runtime.instance_id, req)]
    assert [t for o in outs for t in o.token_ids] == [5, 6, 7]
    assert outs[-1].finish_reason == "stop"
    assert engine.request_ids_seen == ["req-1"]
    assert engine.aborted == []  # finished streams are not aborted
    await host.stop(grace=1)
    await runtime.shutdown()


async def test_closing_the_stream_aborts_the_request_in_the_engine():
    engine = FullEngine("m", script=list(range(100)), delay=0.01)
    runtime, host = await start_host(engine)
    client = await runtime.client(host.endpoint)
    await client.wait_for_instances(1, timeout=2)
    stream = client.generate(
        runtime.instance_id, EngineRequest(request_id="r", model="m", token_ids=[1])
    )
    await stream.__anext__()
    await stream.__anext__()
    await stream.aclose()
    assert engine.aborted == ["r"]
    assert engine.running == set()

    # A cancelled caller task aborts too.
    async def consume():
        req = EngineRequest(request_id="r2", model="m", token_ids=[1])
        async for _ in client.generate(runtime.instance_id, req):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert engine.aborted == ["r", "r2"]
    assert host.metrics.aborts._value.get() == 2
    await host.stop(grace=1)
    await runtime.shutdown()


async def test_engine_errors_become_an_error_output():
    engine = FullEngine("m")
    runtime, host = await start_host(engine)
    client = await runtime.client(host.endpoint)
    await client.wait_for_instances(1, timeout=2)
    outs = [
        o
        async for o in client.generate(
            runtime.instance_id, EngineRequest(request_id="e", model="m")
        )
    ]
    assert len(outs) == 1
    assert outs[0].finish_reason == "error" and "empty prompt" in outs[0].error
    assert outs[0].error_code == "invalid_request"  # the edge answers 400, not 500
    assert host.metrics.errors._value.get() == 1
    assert host.failure is None  # a bad request is not a dead engine
    await host.stop(grace=1)
    await runtime.shutdown()


async def admin(runtime: Runtime, host: WorkerHost, op: str, **args) -> AdminResponse:
    client = await runtime.client(host.admin_endpoint)
    await client.wait_for_instances(1, timeout=2)
    (resp,) = await client.call(runtime.instance_id, AdminRequest(op=op, args=args))
    await client.close()
    return resp


async def test_admin_ops_map_to_engine_hooks():
    engine = FullEngine("m")
    runtime, host = await start_host(engine)
    assert (await admin(runtime, host, "clear_kv")).ok
    assert engine.cleared == 1
    state = await admin(runtime, host, "kv_state")
    events = msgspec.convert(state.result, list[KvEvent])
    assert events[0].event_id == 7 and isinstance(events[0].data, BlockStored)

    resp = await admin(runtime, host, "load_lora", name="sql", path="/adapters/sql")
    assert resp.ok and resp.result == {"name": "sql", "path": "/adapters/sql"}
    base, adapter = sorted(await cards(runtime), key=lambda c: c.base_model or "")
    assert [lora.name for lora in base.loras] == ["sql"]  # the card is republished
    assert (adapter.name, adapter.base_model) == ("sql", "m")  # and the adapter has one
    assert (await admin(runtime, host, "list_loras")).result == [
        {"name": "sql", "path": "/adapters/sql"}
    ]
    assert (await admin(runtime, host, "unload_lora", name="sql")).ok
    (card,) = await cards(runtime)
    assert card.loras == []

    bad = await admin(runtime, host, "load_lora", name="x")
    assert not bad.ok and "'path'" in bad.error
    unknown = await admin(runtime, host, "explode")
    assert not unknown.ok and "unknown admin op 'explode'" in unknown.error
    assert "clear_kv" in unknown.error
    bad_level = await admin(runtime, host, "sleep", level="deep")
    assert not bad_level.ok and "level" in bad_level.error
    await host.stop(grace=1)
    await runtime.shutdown()


async def test_unsupported_admin_ops_answer_with_a_clear_error():
    runtime, host = await start_host(ScriptedEngine("m"))
    for op in ("clear_kv", "sleep", "wake"):
        resp = await admin(runtime, host, op)
        assert not resp.ok
        assert "ScriptedEngine" in resp.error and (
            "cannot" in resp.error or "not support" in resp.error
        )
    resp = await admin(runtime, host, "load_lora", name="a", path="/a")
    assert not resp.ok and "LoRA" in resp.error
    assert (await admin(runtime, host, "list_loras")).result == []
    await host.stop(grace=1)
    await runtime.shutdown()


async def _first(iterator, count: int = 1) -> list:
    out = []
    async for item in iterator:
        out.append(item)
        if len(out) == count:
            return out
    return out


async def test_kv_events_and_load_reports_reach_subscribers():
    engine = FullEngine("m")
    runtime, host = await start_host(engine, load_report_interval=0.02)
    listener = await Runtime.create(RuntimeConfig(discovery="mem"))
    kv_task = asyncio.create_task(_first(listener.subscribe("kv_events", KvEventBatch)))
    load_task = asyncio.create_task(_first(listener.subscribe("load", LoadReport)))
    await asyncio.sleep(0.01)  # let the subscriptions register
    batch = [
        KvEvent(worker_id=runtime.instance_id, event_id=1, data=BlockStored(block_hashes=[11, 12])),
        KvEvent(worker_id=runtime.instance_id, event_id=2, data=AllCleared()),
    ]
    await engine.events.put(batch)
    (got,) = await asyncio.wait_for(kv_task, 5)
    assert got.events == batch
    (report,) = await asyncio.wait_for(load_task, 5)
    assert report.worker_id == runtime.instance_id
    await host.stop(grace=1)
    await runtime.shutdown()
    await listener.shutdown()


class HangingEngine(ScriptedEngine):
    async def generate(self, request):
        await asyncio.sleep(3600)
        yield EngineOutput()


class DeadEngine(ScriptedEngine):
    async def generate(self, request):
        raise EngineDead("CUDA error: device lost")
        yield EngineOutput()


async def test_a_failed_health_check_is_fatal_and_unregisters():
    engine = HangingEngine("m")
    runtime, host = await start_host(engine, health_check_interval=0.05, health_check_timeout=0.2)
    reasons = []
    host.on_fatal(reasons.append)
    client = await runtime.client(host.endpoint)
    await client.wait_for_instances(1, timeout=2)
    reason = await asyncio.wait_for(host.wait_fatal(), 10)
    assert "health check failed" in reason and "0.2s" in reason
    assert reasons == [reason]
    assert not host.healthy
    for _ in range(100):
        if not client.instance_ids() and not await cards(runtime):
            break
        await asyncio.sleep(0.01)
    assert client.instance_ids() == [] and await cards(runtime) == []
    assert engine.aborted and engine.aborted[0].startswith("health-")
    await host.stop(grace=0)
    await runtime.shutdown()


async def test_health_check_passes_on_a_working_engine():
    runtime, host = await start_host(ScriptedEngine("m"))
    assert await host.check_health() is None
    await host.stop(grace=0)
    await runtime.shutdown()


async def test_engine_dead_during_a_request_is_fatal():
    runtime, host = await start_host(DeadEngine("m"))
    client = await runtime.client(host.endpoint)
    await client.wait_for_instances(1, timeout=2)
    req = EngineRequest(request_id="d", model="m", token_ids=[1])
    with pytest.raises(Exception, match="engine died"):
        [o async for o in client.generate(runtime.instance_id, req)]
    assert "device lost" in await asyncio.wait_for(host.wait_fatal(), 5)
    await host.stop(grace=0)
    await runtime.shutdown()


async def test_status_server_reports_health_and_metrics():
    engine = FullEngine("m", script=[3])
    runtime, host = await start_host(engine, system_port=0)
    client = await runtime.client(host.endpoint)
    await client.wait_for_instances(1, timeout=2)
    [
        o
        async for o in client.generate(
            runtime.instance_id, EngineRequest(request_id="x", model="m", token_ids=[1])
        )
    ]
    base = f"http://127.0.0.1:{host.status.port}"
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{base}/live") as r:
            assert r.status == 200
        async with http.get(f"{base}/health") as r:
            assert r.status == 200 and (await r.json())["model"] == "m"
        async with http.get(f"{base}/metrics") as r:
            text = await r.text()
        assert 'stator_worker_requests_total{model="m"} 1.0' in text
        assert "stator_worker_inflight_requests" in text
        assert "stator_worker_kv_usage" in text and "stator_worker_uptime_seconds" in text
        assert "stator_worker_model_load_seconds" in text
        host.fatal("test says so")
        async with http.get(f"{base}/health") as r:
            assert r.status == 503 and (await r.json())["error"] == "test says so"
    await host.stop(grace=0)
    await runtime.shutdown()


async def test_health_probe_asks_for_one_token():
    engine = FullEngine("m", script=[9, 9, 9])
    runtime, host = await start_host(engine)
    assert await host.check_health() is None
    probe = engine.requests[-1]
    assert probe.stop == StopConditions(max_tokens=1, ignore_eos=True)
    await host.stop(grace=0)
    await runtime.shutdown()


class WedgedEngine(HangingEngine):
    """Hangs in generate and in abort: the probe's cleanup hangs too."""

    async def abort(self, request_id: str) -> None:
        await asyncio.sleep(3600)


async def test_health_verdict_does_not_wait_for_a_wedged_engine():
    runtime, host = await start_host(WedgedEngine("m"), health_check_timeout=0.1)
    problem = await asyncio.wait_for(host.check_health(), 5)
    assert problem == "no answer within 0.1s"
    await host.stop(grace=0)
    await runtime.shutdown()
