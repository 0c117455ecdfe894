"""The global router in process: pools are namespaces of `ScriptedEngine` workers on mem
discovery; requests land in the pool their targets pick and fall back when it cannot
serve. Also embedded in a frontend, over HTTP."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from prometheus_client import CollectorRegistry

from stator.frontend import running_frontend
from stator.frontend.metrics import FrontendMetrics
from stator.global_router import GlobalRouter, parse_config
from stator.protocols import EngineRequest, RoutingHints, StopConditions
from stator.router import RouterConfig
from stator.runtime import Runtime, RuntimeConfig
from tests.fakes import ScriptedEngine
from tests.frontend.harness import engine_handler

DISCOVERY = "mem:global-router"
# ttft < 500 ms -> pool 0 ("fast"), else pool 1 ("slow"); one ISL bucket.
CONFIG = {
    "prefill_pool_namespaces": ["fast", "slow"],
    "prefill_pool_selection_strategy": {
        "isl_min": 0,
        "isl_max": 4096,
        "isl_resolution": 1,
        "ttft_min": 0,
        "ttft_max": 1000,
        "ttft_resolution": 2,
        "prefill_pool_mapping": [[0, 1]],
    },
}


class Fleet:
    def __init__(self) -> None:
        self.workers: dict[str, list[tuple[Runtime, ScriptedEngine]]] = {}

    async def add(self, pool: str, source_path: str = "", **engine) -> ScriptedEngine:
        runtime = await Runtime.create(RuntimeConfig(discovery=DISCOVERY, namespace=pool))
        engine = ScriptedEngine("tiny", source_path=source_path, **engine)
        engine.worker_id = runtime.instance_id
        await engine.start()
        endpoint = f"{pool}.backend.generate"
        await runtime.serve(endpoint, engine_handler(engine), EngineRequest)
        await runtime.publish_model_card(endpoint, engine.model_card())
        self.workers.setdefault(pool, []).append((runtime, engine))
        return engine

    async def kill(self, pool: str) -> None:
        for runtime, _ in self.workers.pop(pool, []):
            await runtime.shutdown()

    async def close(self) -> None:
        for pool in list(self.workers):
            await self.kill(pool)


async def until(check, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


def request(ttft: float | None = None, rid: str = "r", priority: int = 0) -> EngineRequest:
    return EngineRequest(
        request_id=rid,
        model="tiny",
        token_ids=[1, 2, 3, 4],
        stop=StopConditions(max_tokens=3),
        routing=RoutingHints(ttft_target_ms=ttft) if ttft is not None else None,
        priority=priority,
    )


async def collect(gr: GlobalRouter, req: EngineRequest) -> list[int]:
    return [t async for out in gr.generate(req) for t in out.token_ids]


def sample(registry: CollectorRegistry, name: str, **labels) -> float:
    return registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
async def fleet():
    fleet = Fleet()
    yield fleet
    await fleet.close()


@pytest.fixture
async def router_and_registry():
    registry = CollectorRegistry()
    gr = GlobalRouter(
        parse_config(CONFIG),
        RuntimeConfig(discovery=DISCOVERY),
        RouterConfig(router_mode="round-robin"),
        registry=registry,
    )
    await gr.start()
    yield gr, registry
    await gr.close()


async def test_targets_pick_the_pool_and_empty_pools_fall_back(fleet, router_and_registry):
    gr, registry = router_and_registry
    fast = await fleet.add("fast")
    slow = await fleet.add("slow")
    await until(lambda: gr.live_workers("tiny") and len(gr.live_workers("tiny")) == 2)
    assert await collect(gr, request(ttft=100, rid="a")) == [1, 2, 3]
    assert await collect(gr, request(ttft=900, rid="b")) == [1, 2, 3]
    assert [r.request_id for r in fast.requests] == ["a"]
    assert [r.request_id for r in slow.requests] == ["b"]
    # No target: the midpoint (500) -> index 1 -> slow.
    await collect(gr, request(rid="c"))
    assert slow.requests[-1].request_id == "c"
    labels = {
        "model": "tiny",
        "stage": "prefill",
        "pool": "fast",
        "prefill_pool": "",
        "reason": "grid",
    }
    assert sample(registry, "stator_global_router_decisions_total", **labels) == 1
    workers = {"pool": "fast", "model": "tiny", "role": "serve"}
    assert sample(registry, "stator_global_router_pool_workers", **workers) == 1

    await fleet.kill("fast")
    await until(lambda: gr.pools["fast"].live_workers("tiny") == [])
    assert await collect(gr, request(ttft=100, rid="d")) == [1, 2, 3]
    assert slow.requests[-1].request_id == "d"
    assert (
        sample(
            registry, "stator_global_router_fallbacks_total", model="tiny", pool="fast", why="empty"
        )
        >= 1
    )
    labels = {
        "model": "tiny",
        "stage": "prefill",
        "pool": "slow",
        "prefill_pool": "",
        "reason": "fallback",
    }
    assert sample(registry, "stator_global_router_decisions_total", **labels) == 1


async def test_no_pool_serves_the_model(router_and_registry):
    from stator.runtime import NoInstances

    gr, registry = router_and_registry
    with pytest.raises(NoInstances):
        await collect(gr, request(ttft=100))
    assert sample(registry, "stator_global_router_unserved_total", model="tiny") == 1


async def test_busy_pool_falls_back_to_the_next(fleet):
    registry = CollectorRegistry()
    gr = GlobalRouter(
        parse_config(CONFIG),
        RuntimeConfig(discovery=DISCOVERY),
        # busy as soon as any prompt token waits for prefill
        RouterConfig(router_mode="round-robin", active_prefill_tokens_threshold=0),
        registry=registry,
    )
    await gr.start()
    try:
        fast = await fleet.add("fast", delay=0.05)
        slow = await fleet.add("slow")
        await until(lambda: len(gr.live_workers("tiny")) == 2)
        fast.delay = 0.5  # the first token takes a while: its prefill stays booked
        held = asyncio.create_task(collect(gr, request(ttft=100, rid="held")))
        await until(lambda: len(fast.requests) == 1)
        assert await collect(gr, request(ttft=100, rid="next")) == [1, 2, 3]
        assert slow.requests[-1].request_id == "next"
        assert (
            sample(
                registry,
                "stator_global_router_fallbacks_total",
                model="tiny",
                pool="fast",
                why="busy",
            )
            == 1
        )
        await held
    finally:
        await gr.close()


async def test_priority_override_picks_its_pool(fleet):
    config = {**CONFIG}
    strategy = dict(CONFIG["prefill_pool_selection_strategy"])
    strategy["priority_overrides"] = [{"min_priority": 5, "max_priority": 10, "target_pool": 1}]
    config["prefill_pool_selection_strategy"] = strategy
    gr = GlobalRouter(
        parse_config(config), RuntimeConfig(discovery=DISCOVERY), RouterConfig(),
        registry=CollectorRegistry(),
    )  # fmt: skip
    await gr.start()
    try:
        await fleet.add("fast")
        slow = await fleet.add("slow")
        await until(lambda: len(gr.live_workers("tiny")) == 2)
        await collect(gr, request(ttft=100, rid="vip", priority=7))
        assert slow.requests[-1].request_id == "vip"
    finally:
        await gr.close()


async def test_embedded_in_the_frontend(fleet, tiny_model_dir):
    metrics = FrontendMetrics()
    gr = GlobalRouter(
        parse_config(CONFIG), RuntimeConfig(discovery=DISCOVERY), RouterConfig(),
        registry=metrics.registry,
    )  # fmt: skip
    await gr.start()
    runtime = await Runtime.create(RuntimeConfig(discovery=DISCOVERY, namespace="front"))
    try:
        async with running_frontend(runtime, routes=gr, metrics=metrics) as frontend:
            fast = await fleet.add("fast", source_path=str(tiny_model_dir))
            slow = await fleet.add("slow", source_path=str(tiny_model_dir))
            await frontend.manager.wait_for_model("tiny")
            await until(lambda: len(gr.live_workers("tiny")) == 2)
            async with httpx.AsyncClient(base_url=frontend.base_url, timeout=30) as http:
                body = {"model": "tiny", "prompt": "hello there", "max_tokens": 2}
                r = await http.post("/v1/completions", json=body, headers={"x-ttft-target": "50"})
                assert r.status_code == 200, r.text
                assert len(fast.requests) == 1 and not slow.requests
                assert fast.requests[0].routing.ttft_target_ms == 50
                body["nvext"] = {"ttft_target": 800}
                r = await http.post("/v1/completions", json=body, headers={"x-ttft-target": "50"})
                assert r.status_code == 200, r.text
                assert len(slow.requests) == 1
                r = await http.post("/v1/completions", json=body, headers={"x-ttft-target": "x"})
                assert r.status_code == 400
                assert "x-ttft-target" in r.json()["error"]["message"]
                health = (await http.get("/health")).json()
                assert health
                text = (await http.get("/metrics")).text
                assert "stator_global_router_decisions_total" in text
                await fleet.kill("fast")
                await until(lambda: gr.pools["fast"].live_workers("tiny") == [])
                del body["nvext"]
                r = await http.post("/v1/completions", json=body, headers={"x-ttft-target": "50"})
                assert r.status_code == 200, r.text
                assert len(slow.requests) == 2
                await fleet.kill("slow")
                await until(lambda: "tiny" not in frontend.manager.models)
    finally:
        await runtime.shutdown()
        await gr.close()


async def test_a_pool_that_dies_mid_stream_hands_the_stream_on(fleet, router_and_registry):
    gr, registry = router_and_registry
    script = list(range(100, 110))
    fast = await fleet.add("fast", script=script, delay=0.02)
    slow = await fleet.add("slow", script=script)
    await until(lambda: len(gr.live_workers("tiny")) == 2)
    req = request(ttft=100, rid="moving")
    req.stop.max_tokens = 6
    got: list[int] = []
    async for out in gr.generate(req):
        got.extend(out.token_ids)
        if len(got) == 2:
            runtime, _ = fleet.workers["fast"][0]
            await runtime._server.stop()  # the worker dies mid-stream
        if out.finish_reason:
            assert out.usage.completion_tokens == 6
    assert len(got) == 6 and got[:2] == [100, 101]
    assert len(fast.requests) == 1
    (continued,) = slow.requests
    assert continued.token_ids == [1, 2, 3, 4, 100, 101]
    assert continued.stop.max_tokens == 4
    assert (
        sample(
            registry,
            "stator_global_router_fallbacks_total",
            model="tiny",
            pool="fast",
            why="failed",
        )
        == 1
    )


def test_plan_pairs_prefill_pools_with_decode_pools_in_grid_order():
    config = parse_config(
        {
            "prefill_pool_namespaces": ["p0", "p1"],
            "decode_pool_namespaces": ["d0", "d1"],
            "prefill_pool_selection_strategy": CONFIG["prefill_pool_selection_strategy"],
            "decode_pool_selection_strategy": {
                "context_length_min": 0, "context_length_max": 4096,
                "context_length_resolution": 1, "itl_min": 0, "itl_max": 100,
                "itl_resolution": 2, "decode_pool_mapping": [[0, 1]],
            },
        }
    )  # fmt: skip
    gr = GlobalRouter(config, RuntimeConfig(discovery=DISCOVERY), RouterConfig())
    req = request(ttft=900)  # prefill pool p1; no ITL target: midpoint -> d1
    plan = [
        (c.prefill.namespace if c.prefill else None, c.pool.namespace, c.stage, c.reason)
        for c in gr.plan(req)
    ]
    assert plan == [
        ("p1", "d1", "disagg", "grid"),
        ("p1", "d0", "disagg", "fallback"),
        (None, "p1", "prefill", "grid"),
        ("p0", "d1", "disagg", "fallback"),
        ("p0", "d0", "disagg", "fallback"),
        (None, "p0", "prefill", "fallback"),
        (None, "d1", "decode", "grid"),
        (None, "d0", "decode", "fallback"),
    ]
