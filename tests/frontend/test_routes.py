"""Models, health, liveness, metrics, docs; models come and go with their workers; a
client that goes away cancels its request down to the engine."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from tests.fakes import ScriptedEngine
from tests.frontend.conftest import ECHO, SLOW, STORY


def test_list_models(client):
    ids = [m.id for m in client.models.list().data]
    assert ECHO in ids and STORY in ids and SLOW in ids


def test_get_model_with_a_slash_in_its_id(client, http):
    model = client.models.retrieve(STORY)
    assert model.id == STORY and model.object == "model" and model.owned_by == "stator"
    assert http.get(f"/v1/models/{STORY}").json()["max_model_len"] == 4096
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("test/unknown")


def test_health_and_live(http):
    health = http.get("/health")
    assert health.status_code == 200
    body = health.json()
    assert body["status"] == "healthy"
    assert ECHO in body["models"] and len(body["instances"][ECHO]) == 1
    assert http.get("/live").json() == {"status": "live"}


def test_openapi_and_docs(http):
    spec = http.get("/openapi.json").json()
    assert "/v1/chat/completions" in spec["paths"] and "/v1/completions" in spec["paths"]
    schemas = spec["components"]["schemas"]
    assert "messages" in schemas["ChatCompletionRequest"]["properties"]
    assert "prompt" in schemas["CompletionRequest"]["properties"]
    refs = []

    def collect(node):
        if isinstance(node, dict):
            refs.extend(v for k, v in node.items() if k == "$ref")
            for v in node.values():
                collect(v)
        elif isinstance(node, list):
            for v in node:
                collect(v)

    collect(spec)
    assert refs and all(r.rsplit("/", 1)[-1] in schemas for r in refs)
    assert http.get("/docs").status_code == 200


def test_metrics(client, http):
    client.chat.completions.create(
        model=STORY, messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    text = http.get("/metrics").text
    for name in (
        'stator_frontend_requests_total{endpoint="/v1/chat/completions",status="200"}',
        "stator_frontend_inflight_requests",
        "stator_frontend_time_to_first_token_seconds_bucket",
        "stator_frontend_inter_token_latency_seconds_bucket",
        "stator_frontend_request_duration_seconds_bucket",
        "stator_frontend_input_tokens_bucket",
        "stator_frontend_output_tokens_bucket",
        "stator_frontend_cached_tokens_total",
        'stator_frontend_stage_seconds_bucket{le="0.0001",stage="template"}',
        'stage="tokenize"',
        'stage="route"',
        'stage="detokenize"',
        "stator_frontend_client_disconnects_total",
        "stator_frontend_models 4.0",
    ):
        assert name in text, name


def test_model_appears_and_disappears_with_its_workers(stack, client, http):
    name = "test/dynamic"
    first = stack.add_worker(ScriptedEngine(name), "stator.dyn.generate", wait_model=name)
    second = stack.add_worker(ScriptedEngine(name), "stator.dyn.generate")
    deadline = time.monotonic() + 10
    while len(http.get("/health").json()["instances"][name]) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert name in [m.id for m in client.models.list().data]
    stack.remove_worker(first)
    assert (
        client.completions.create(model=name, prompt="still here", max_tokens=50).choices[0].text
        == "still here"
    )
    stack.remove_worker(second)
    deadline = time.monotonic() + 10
    while name in [m.id for m in client.models.list().data]:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model=name, prompt="x")


async def _disconnect_mid_stream(base_url: str, path: str, body: dict, after: int = 3) -> None:
    async with (
        httpx.AsyncClient(base_url=base_url, timeout=30) as http,
        http.stream("POST", path, json=body) as resp,
    ):
        assert resp.status_code == 200
        seen = 0
        async for line in resp.aiter_lines():
            if line.startswith("data: {"):
                seen += 1
            if seen >= after:
                break  # leaving the block closes the connection


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_client_disconnect_aborts_the_engine_request(stack, engines, path):
    engine = engines[SLOW]
    body = {"model": SLOW, "stream": True}
    if path == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": "go"}]
    else:
        body["prompt"] = "go"
    before = len(engine.requests)
    await _disconnect_mid_stream(stack.base_url, path, body)
    request_id = engine.requests[before].request_id
    deadline = time.monotonic() + 10
    while request_id not in engine.aborted or engine.running:
        assert time.monotonic() < deadline, "the engine never saw the abort"
        await asyncio.sleep(0.02)


async def test_disconnect_while_engine_is_silent_aborts(stack, engines):
    """The engine is between tokens (3 s apart): the abort must not wait for the next."""
    engine = engines[SLOW]
    old_delay = engine.delay
    engine.delay = 3.0
    try:
        before = len(engine.requests)
        body = {"model": SLOW, "prompt": "go", "stream": True, "max_tokens": 3}
        await _disconnect_mid_stream(stack.base_url, "/v1/completions", body, after=1)
        left = time.monotonic()
        request_id = engine.requests[before].request_id
        while request_id not in engine.aborted:
            assert time.monotonic() - left < 2.5, "abort waited for the engine's next token"
            await asyncio.sleep(0.02)
    finally:
        engine.delay = old_delay


def test_disconnect_is_counted(stack, http):
    text = http.get("/metrics").text
    assert "stator_frontend_client_disconnects_total" in text


def test_health_is_503_without_live_workers(tiny_model_dir):
    from tests.frontend.harness import Stack

    empty = Stack(tiny_model_dir, store="frontend-tests-empty").start()
    try:
        with httpx.Client(base_url=empty.base_url, timeout=30) as http:
            resp = http.get("/health")
            assert resp.status_code == 503
            assert resp.json()["status"] == "unhealthy"
            assert http.get("/live").status_code == 200
            assert http.get("/v1/models").json() == {"data": [], "object": "list"}
    finally:
        empty.stop()


def test_request_id_reaches_the_request_path(stack, http, monkeypatch):
    """Code serving a request (routing, here) sees the request's id in `request_id_var`,
    so its log lines carry it."""
    from stator.logs import request_id_var
    from stator.protocols import EngineOutput

    pipeline = stack.call(stack.frontend.manager.pipeline(ECHO))
    seen: list[str] = []

    async def recording(request):
        seen.append(request_id_var.get())
        yield EngineOutput(token_ids=request.token_ids[:1], finish_reason="stop")

    monkeypatch.setattr(pipeline.router, "generate", recording)
    for stream in (False, True):
        resp = http.post(
            "/v1/completions",
            json={"model": ECHO, "prompt": "x", "stream": stream},
            headers={"x-request-id": f"trace-{stream}"},
        )
        assert resp.status_code == 200
    assert seen == ["trace-False", "trace-True"]


async def _wait_aborted(engine, before: int, limit: float) -> None:
    left = time.monotonic()
    while (
        len(engine.requests) <= before or engine.requests[before].request_id not in engine.aborted
    ):
        assert time.monotonic() - left < limit, "the engine never saw the abort"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("first_token_delay", [0.02, 3.0])
async def test_non_streaming_disconnect_aborts(stack, engines, first_token_delay):
    """A client that gives up on a non-streaming answer (while generating, or still
    waiting for the first token) cancels the engine request too."""
    engine = engines[SLOW]
    old_delay = engine.delay
    engine.delay = first_token_delay
    try:
        before = len(engine.requests)
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=1.0) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.post("/v1/completions", json={"model": SLOW, "prompt": "go"})
        await _wait_aborted(engine, before, limit=2.5)
    finally:
        engine.delay = old_delay
