"""Reading traffic from frontend metrics: parse, delta, quantile as Prometheus does; the
same from a (faked) Prometheus HTTP API."""

from __future__ import annotations

import pytest
from aiohttp import web

from stator.frontend.metrics import FrontendMetrics
from stator.planner.observe import Histogram, PrometheusReader, merge, parse_metrics, traffic


def test_quantile_matches_histogram_quantile():
    h = Histogram({0.1: 50, 0.2: 90, 0.5: 100, float("inf"): 100}, count=100, sum=12)
    assert h.quantile(0.5) == pytest.approx(0.1)
    assert h.quantile(0.9) == pytest.approx(0.2)
    assert h.quantile(0.95) == pytest.approx(0.2 + 0.3 * 5 / 10)
    assert Histogram().quantile(0.9) is None
    over = Histogram({1.0: 0, float("inf"): 10}, count=10)
    assert over.quantile(0.9) == 1.0


def scrape(metrics: FrontendMetrics) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry).decode()


def test_traffic_between_two_scrapes_of_a_real_frontend_registry():
    metrics = FrontendMetrics()
    m = metrics.for_model("tiny")
    for _ in range(10):
        m.input_tokens.observe(1000)
        m.output_tokens.observe(100)
        m.ttft.observe(0.3)
    first = parse_metrics(scrape(metrics))
    for i in range(20):
        m.input_tokens.observe(3000)
        m.output_tokens.observe(50)
        m.ttft.observe(0.04 if i < 18 else 2.0)
        m.itl.observe(0.012)
    second = parse_metrics(scrape(metrics))
    t = traffic(second, first)
    assert t.requests == 20
    assert t.isl == pytest.approx(3000) and t.osl == pytest.approx(50)
    assert 2048 < t.isl_p90 <= 4096  # the 3000-token prompts' power-of-two bucket
    assert 25 <= t.ttft_p90_ms <= 50  # inside the 25-50 ms bucket
    assert 10 <= t.itl_p90_ms <= 15
    assert traffic(first, None).requests == 10
    # a restarted frontend (counters back near zero) counts from zero, not negative
    assert traffic(first, second).requests == 10
    assert merge([first, first]).histograms["stator_frontend_input_tokens"].count == 20


def test_pool_decisions_are_read_per_pool():
    text = (
        "# TYPE stator_global_router_decisions_total counter\n"
        'stator_global_router_decisions_total{model="m",stage="prefill",pool="fast",reason="grid"} 7\n'
        'stator_global_router_decisions_total{model="m",stage="prefill",pool="slow",reason="fallback"} 2\n'
        'stator_global_router_decisions_total{model="m",stage="prefill",pool="slow",reason="grid"} 1\n'
    )
    snap = parse_metrics(text)
    assert snap.pool_decisions == {"fast": 7, "slow": 3}


async def test_prometheus_reader_against_a_faked_api():
    queries: list[str] = []

    async def query(request: web.Request) -> web.Response:
        q = request.query["query"]
        queries.append(q)
        if "by (pool)" in q:
            result = [{"metric": {"pool": "fast"}, "value": [0, "12"]}]
        elif "histogram_quantile" in q:
            result = [{"metric": {}, "value": [0, "0.25" if "first_token" in q else "NaN"]}]
        elif "first_token_seconds_count" in q:  # started: two still running
            result = [{"metric": {}, "value": [0, "12"]}]
        elif "input_tokens_count" in q:
            result = [{"metric": {}, "value": [0, "10"]}]
        elif "input_tokens_sum" in q:
            result = [{"metric": {}, "value": [0, "20000"]}]
        elif "output_tokens_count" in q:
            result = [{"metric": {}, "value": [0, "10"]}]
        else:
            result = [{"metric": {}, "value": [0, "1500"]}]
        return web.json_response({"status": "success", "data": {"result": result}})

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    reader = PrometheusReader(f"http://127.0.0.1:{port}", model="m")
    try:
        t = await reader.read(30)
    finally:
        await reader.close()
        await runner.cleanup()
    assert (t.requests, t.isl, t.osl) == (12, 2000, 150)
    assert t.ttft_p90_ms == 250 and t.itl_p90_ms is None
    assert t.pool_requests == {"fast": 12}
    assert any('{model="m"}[30s]' in q for q in queries)
