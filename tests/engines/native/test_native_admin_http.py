"""The native engine behind a worker host and a frontend, over HTTP: LoRA adapters loaded
and unloaded at run time (`/v1/load_lora_adapter`, as vLLM), listed in `/v1/models`,
served by name; sleep and wake (`/sleep`, `/wake_up`, `/is_sleeping`); prompt embeddings."""

from __future__ import annotations

import base64
import io

import httpx
import pytest
import torch
from tokenizers import Tokenizer

from stator.engines.native import NativeConfig, create_engine
from stator.frontend import running_frontend
from stator.runtime import Runtime, RuntimeConfig
from stator.worker import WorkerConfig, WorkerHost
from tests.engines.native.lora_adapters import build_adapter
from tests.engines.native.models import hf_greedy, prompt

pytest.importorskip("peft")
QUIET = {"health_check_interval": 0.0, "load_report_interval": 0.0}


@pytest.fixture
async def stack(llama, tmp_path):
    model_dir, hf = llama
    adapter_dir, merged = build_adapter(hf, tmp_path / "adapters" / "sql", seed=7)
    config = NativeConfig(
        device="cpu",
        dtype="float32",
        kv_cache_memory="4MiB",
        enable_lora=True,
        lora_allowed_dirs=[str(tmp_path / "adapters")],
        enable_sleep_mode=True,
        enable_prompt_embeds=True,
    )
    runtime = await Runtime.create(RuntimeConfig(discovery="mem"))
    host = WorkerHost(runtime, create_engine(config, str(model_dir), "tiny"), WorkerConfig(**QUIET))
    await host.start()
    async with running_frontend(runtime) as frontend:
        await frontend.manager.wait_for_model("tiny", 30)
        url = f"http://127.0.0.1:{frontend.port}"
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            yield client, adapter_dir, merged, hf, model_dir
    await host.stop(grace=1)
    await runtime.shutdown()


def expected_text(model_dir, model, ids, n):
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    return tok.decode(hf_greedy(model, ids, n))


async def complete(client, model, **body):
    body = {"model": model, "max_tokens": 8, "temperature": 0, "ignore_eos": True, **body}
    return await client.post("/v1/completions", json=body)


async def test_lora_adapter_load_serve_list_unload(stack):
    client, adapter_dir, merged, hf, model_dir = stack
    ids = prompt(5, 14)
    r = await client.post(
        "/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": str(adapter_dir)}
    )
    assert r.status_code == 200, r.text
    models = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
    assert models["sql"]["parent"] == "tiny" and "parent" not in models["tiny"]
    with_adapter = await complete(client, "sql", prompt=ids)
    assert with_adapter.status_code == 200, with_adapter.text
    assert with_adapter.json()["choices"][0]["text"] == expected_text(model_dir, merged, ids, 8)
    base = await complete(client, "tiny", prompt=ids)
    assert base.json()["choices"][0]["text"] == expected_text(model_dir, hf, ids, 8)

    outside = await client.post(
        "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(model_dir)}
    )
    assert outside.status_code == 400 and "lora-allowed-dirs" in outside.json()["error"]["message"]
    r = await client.post("/v1/unload_lora_adapter", json={"lora_name": "sql"})
    assert r.status_code == 200, r.text
    assert "sql" not in {m["id"] for m in (await client.get("/v1/models")).json()["data"]}
    assert (await complete(client, "sql", prompt=ids)).status_code == 404
    again = await client.post("/v1/unload_lora_adapter", json={"lora_name": "sql"})
    assert again.status_code == 404


async def test_sleep_and_wake_over_http(stack):
    client, _, _, hf, model_dir = stack
    ids = prompt(6, 10)
    before = (await complete(client, "tiny", prompt=ids)).json()["choices"][0]["text"]
    assert (await client.get("/is_sleeping")).json() == {"is_sleeping": False}
    for level in (1, 2):
        # The edge wants a JSON body on state-changing POSTs outside /v1/; vLLM's query
        # parameters still work beside it.
        assert (await client.post(f"/sleep?level={level}", json={})).status_code == 200
        assert (await client.get("/is_sleeping")).json() == {"is_sleeping": True}
        asleep = await complete(client, "tiny", prompt=ids)
        assert asleep.status_code == 503 and "sleeping" in asleep.json()["error"]["message"]
        assert (await client.post("/wake_up", json={"tags": None})).status_code == 200
        assert (await client.get("/is_sleeping")).json() == {"is_sleeping": False}
        after = await complete(client, "tiny", prompt=ids)
        assert after.json()["choices"][0]["text"] == before == expected_text(model_dir, hf, ids, 8)
    assert (await client.post("/sleep", json={"level": 3})).status_code == 400
    assert (await client.post("/sleep?level=1")).status_code == 415  # no JSON: refused


async def test_prompt_embeds_equal_the_token_ids(stack):
    client, _, _, hf, model_dir = stack
    ids = prompt(7, 12)
    with torch.no_grad():
        embeds = hf.get_input_embeddings()(torch.tensor(ids))
    buf = io.BytesIO()
    torch.save(embeds, buf)
    payload = base64.b64encode(buf.getvalue()).decode()
    r = await complete(client, "tiny", prompt_embeds=payload)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == expected_text(model_dir, hf, ids, 8)
    assert r.json()["usage"]["prompt_tokens"] == 12
    buf = io.BytesIO()
    torch.save(torch.zeros(3, 5), buf)
    bad = await complete(client, "tiny", prompt_embeds=base64.b64encode(buf.getvalue()).decode())
    assert bad.status_code == 400 and "hidden size" in bad.json()["error"]["message"]
