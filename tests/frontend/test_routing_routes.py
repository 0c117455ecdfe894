"""The router's HTTP surface: `/busy_threshold`, the `x-worker-instance-id` header, and
overload answered with 503 + Retry-After."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from stator.frontend import FrontendConfig, running_frontend
from stator.protocols import ModelCard
from stator.router import RouterConfig
from stator.runtime import Runtime, RuntimeConfig
from tests.fakes import ScriptedEngine
from tests.frontend.harness import engine_handler

ENDPOINT = "stator.backend.generate"


async def start_worker(model_dir, delay: float = 0.0) -> tuple[Runtime, ScriptedEngine]:
    runtime = await Runtime.create(RuntimeConfig(discovery="mem"))
    engine = ScriptedEngine(
        "m", script=list(range(40, 60)), delay=delay, source_path=str(model_dir)
    )
    await runtime.serve(ENDPOINT, engine_handler(engine))
    card: ModelCard = engine.model_card()
    await runtime.publish_model_card(ENDPOINT, card)
    return runtime, engine


def chat(max_tokens: int = 3) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}


@pytest.fixture
async def fleet(tiny_model_dir, request):
    config, delay = getattr(request, "param", (RouterConfig(), 0.01))
    workers = [await start_worker(tiny_model_dir, delay=delay) for _ in range(2)]
    front_rt = await Runtime.create(RuntimeConfig(discovery="mem"))
    async with running_frontend(
        front_rt, FrontendConfig(http_host="127.0.0.1", http_port=0), config
    ) as front:
        await front.manager.wait_for_model("m", timeout=10)
        async with httpx.AsyncClient(base_url=front.base_url, timeout=30) as http:
            yield http, workers
    for runtime, _ in workers:
        await runtime.shutdown()
    await front_rt.shutdown()


async def test_busy_threshold_get_and_set(fleet):
    http, _ = fleet
    got = (await http.get("/busy_threshold")).json()
    assert got == {
        "thresholds": [
            {
                "model": "m",
                "active_decode_blocks_threshold": None,
                "active_prefill_tokens_threshold": None,
            }
        ]
    }
    resp = await http.post(
        "/busy_threshold", json={"model": "m", "active_decode_blocks_threshold": 0.8}
    )
    assert resp.status_code == 200 and resp.json()["active_decode_blocks_threshold"] == 0.8
    got = (await http.get("/busy_threshold")).json()["thresholds"][0]
    assert got["active_decode_blocks_threshold"] == 0.8
    bad = await http.post(
        "/busy_threshold", json={"model": "m", "active_decode_blocks_threshold": -1}
    )
    assert bad.status_code == 400 and "error" in bad.json()
    assert (await http.post("/busy_threshold", json={"model": "x"})).status_code == 404
    malformed = await http.post(
        "/busy_threshold", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert malformed.status_code == 400
    # A cross-site "simple" request (text/plain, another Origin) changes nothing.
    plain = await http.post("/busy_threshold", content=b'{"model": "m"}')
    assert plain.status_code == 415
    cross = await http.post(
        "/busy_threshold", json={"model": "m"}, headers={"origin": "https://evil.example"}
    )
    assert cross.status_code == 403 and cross.json()["error"]["code"] == "cross_origin_refused"


async def test_worker_header_pins_the_worker(fleet):
    http, workers = fleet
    (_, a_engine), (b_rt, b_engine) = workers
    for _ in range(3):
        resp = await http.post(
            "/v1/chat/completions",
            json=chat(),
            headers={"x-worker-instance-id": f"{b_rt.instance_id:x}"},
        )
        assert resp.status_code == 200, resp.text
    assert len(b_engine.requests) == 3 and not a_engine.requests
    bad = await http.post(
        "/v1/chat/completions", json=chat(), headers={"x-worker-instance-id": "not-hex"}
    )
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "x-worker-instance-id"


@pytest.mark.parametrize("fleet", [(RouterConfig(router_mode="direct"), 0.01)], indirect=True)
async def test_direct_mode_needs_a_worker(fleet):
    http, _ = fleet
    resp = await http.post("/v1/chat/completions", json=chat())
    assert resp.status_code == 400 and "error" in resp.json()


@pytest.mark.parametrize(
    "fleet",
    [(RouterConfig(active_prefill_tokens_threshold=0, router_queue_size=0), 1.0)],
    indirect=True,
)
async def test_overload_is_a_503_with_retry_after(fleet):
    http, workers = fleet
    # Two slow requests keep both workers busy: their prompt tokens stay booked as
    # prefill until their first token, a second away.
    busy = [asyncio.create_task(http.post("/v1/chat/completions", json=chat(2))) for _ in range(2)]
    while not all(engine.running for _, engine in workers):
        await asyncio.sleep(0.005)
    resp = await http.post("/v1/chat/completions", json=chat())
    assert resp.status_code == 503, resp.text
    assert "retry-after" in resp.headers and resp.json()["error"]["message"]
    assert all(r.status_code == 200 for r in await asyncio.gather(*busy))
    metrics = (await http.get("/metrics")).text
    assert "stator_router_rejections_total" in metrics
