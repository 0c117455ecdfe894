"""The vLLM engine under stator's WorkerHost on an in-process runtime: card, streaming
through the request plane, KV events on the event plane, LoRA cards, health probe, sleep
refused, vLLM metrics on the worker's registry."""

from __future__ import annotations

import asyncio

import pytest

from tests.engines.vllm.conftest import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

from prometheus_client import generate_latest

from stator.engines.vllm import VllmConfig, create_engine
from stator.protocols import AdminRequest, BlockStored, KvEventBatch, ModelCard, decode
from stator.runtime import Runtime, RuntimeConfig
from stator.runtime.names import models_prefix
from stator.worker.config import WorkerConfig
from stator.worker.host import WorkerHost
from tests.engines.vllm.helpers import TEST_ENGINE_ARGS, greedy_request, tokens

pytestmark = pytest.mark.integration


async def cards(runtime: Runtime) -> dict[str, ModelCard]:
    entries = await runtime.discovery.get_prefix(models_prefix())
    found = [decode(v, ModelCard) for v in entries.values()]
    return {c.name: c for c in found}


async def admin(runtime: Runtime, host: WorkerHost, op: str, **args):
    client = await runtime.client(host.admin_endpoint)
    await client.wait_for_instances(1, timeout=10)
    (resp,) = await client.call(runtime.instance_id, AdminRequest(op=op, args=args))
    await client.close()
    return resp


async def test_vllm_engine_under_the_worker_host(llama_dir, lora_dir):
    engine = create_engine(
        VllmConfig.make(
            {**TEST_ENGINE_ARGS, "enable_lora": True, "max_lora_rank": 8, "max_loras": 2}
        ),
        str(llama_dir),
        "tiny",
    )
    runtime = await Runtime.create(RuntimeConfig(discovery="mem"))
    host = WorkerHost(
        runtime,
        engine,
        WorkerConfig(health_check_interval=0, load_report_interval=0),
        model_dir=llama_dir,
    )
    listener = await Runtime.create(RuntimeConfig(discovery="mem"))
    kv_batches: list[KvEventBatch] = []

    async def listen():
        async for batch in listener.subscribe("kv_events", KvEventBatch):
            kv_batches.append(batch)

    listening = asyncio.create_task(listen())
    await host.start()
    try:
        card = (await cards(runtime))["tiny"]
        assert card.engine == "vllm" and card.kv_block_size == engine.model_card().kv_block_size
        assert card.total_kv_blocks > 0 and "tokenizer.json" in card.files

        client = await runtime.client(host.endpoint)
        await client.wait_for_instances(1, timeout=10)
        prompt = list(range(10, 10 + card.kv_block_size + 8))
        base = [
            o async for o in client.generate(runtime.instance_id, greedy_request("h-1", prompt))
        ]
        assert base[-1].finish_reason == "length" and len(tokens(base)) == 8

        for _ in range(200):
            stored = [
                e.data
                for b in kv_batches
                for e in b.events
                if isinstance(e.data, BlockStored) and e.data.token_ids[:4] == prompt[:4]
            ]
            if stored:
                break
            await asyncio.sleep(0.05)
        assert stored, "no BlockStored for the prompt reached the event plane"
        assert stored[0].token_ids == prompt[: card.kv_block_size]

        loaded = await admin(runtime, host, "load_lora", name="ad1", path=f"file://{lora_dir}")
        assert loaded.ok, loaded.error
        published = await cards(runtime)
        assert published["ad1"].base_model == "tiny"
        assert [lora.name for lora in published["tiny"].loras] == ["ad1"]
        request = greedy_request("h-2", prompt)
        request.model = "ad1"  # the adapter's own model name routes to the adapter
        adapted = [o async for o in client.generate(runtime.instance_id, request)]
        assert tokens(adapted) != tokens(base)
        assert (await admin(runtime, host, "unload_lora", name="ad1")).ok
        assert set(await cards(runtime)) == {"tiny"}

        assert await host.check_health() is None  # the one-token probe
        refused = await admin(runtime, host, "sleep", level=1)
        assert not refused.ok and "sleep mode" in refused.error

        exposition = generate_latest(host.metrics.registry).decode()
        assert "stator_worker_engine_vllm_prompt_tokens_total" in exposition
        assert 'model="tiny"' in exposition
        await client.close()
    finally:
        listening.cancel()
        await host.stop(grace=5)
        await runtime.shutdown()
        await listener.shutdown()
