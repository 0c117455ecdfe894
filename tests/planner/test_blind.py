"""A planner whose frontend is down keeps running: it holds the fleet, says so (metric,
`/health` 503, one log line), retries with backoff and plans again when the frontend is
back. Down at start, going away, coming back; in process and as a `stator planner`
process (the Kubernetes crash loop this replaces)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time

import httpx
import pytest
from aiohttp import web
from prometheus_client import generate_latest

from stator.frontend.metrics import FrontendMetrics
from stator.planner.config import PlannerConfig
from stator.planner.health import Backoff
from stator.planner.observe import FrontendScraper, ObservationUnavailable, PrometheusReader
from stator.planner.service import PlannerService, PlannerServiceConfig
from stator.runtime import RuntimeConfig
from tests.planner.test_service import RecordingConnector, profile
from tests.procs import free_port, stator_process


def test_backoff_doubles_to_its_cap_and_resets():
    b = Backoff(first=0.5, cap=3.0)
    assert [b.next() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    b.reset()
    assert b.next() == 0.5


class FakeFrontend:
    """A frontend's /metrics (a real `FrontendMetrics` registry) that can go away and come
    back on the same port."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.metrics = FrontendMetrics()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def serve(self, requests: int) -> None:
        m = self.metrics.for_model("tiny")
        for _ in range(requests):
            m.input_tokens.observe(1000)
            m.output_tokens.observe(50)
            m.ttft.observe(0.2)
            m.itl.observe(0.02)

    async def up(self) -> None:
        async def metrics(request: web.Request) -> web.Response:
            return web.Response(body=generate_latest(self.metrics.registry))

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def down(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


async def test_scraper_skips_a_dead_frontend_and_rebaselines_one_that_returns():
    a, b = FakeFrontend(free_port()), FakeFrontend(free_port())
    await a.up()
    reader = FrontendScraper([a.url, b.url], model="tiny")
    try:
        assert await reader.read() is None  # a's baseline; b is down
        assert set(reader.down) == {b.url + "/metrics"}
        a.serve(7)
        b.serve(100)  # served while unreachable: must never count as one interval's burst
        await b.up()
        t = await reader.read()
        assert t is not None and t.requests == 7  # b only took its baseline
        a.serve(1)
        b.serve(2)
        assert (await reader.read()).requests == 3
        await a.down()
        await b.down()
        with pytest.raises(ObservationUnavailable, match="no frontend answered"):
            await reader.read()
    finally:
        await reader.close()
        await a.down()
        await b.down()


async def test_prometheus_down_is_unavailable_not_a_crash():
    reader = PrometheusReader(f"http://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(ObservationUnavailable, match="prometheus"):
            await reader.read(10)
    finally:
        await reader.close()


async def test_prometheus_without_live_frontends_is_unavailable_not_zero_traffic():
    async def query(request: web.Request) -> web.Response:
        # Prometheus answers, but the frontends' series went stale: every result is empty.
        return web.json_response({"status": "success", "data": {"result": []}})

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    reader = PrometheusReader(f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(ObservationUnavailable, match="no frontend is up"):
            await reader.read(10)
    finally:
        await reader.close()
        await runner.cleanup()


async def wait_for(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.05)


async def test_the_loop_holds_the_fleet_while_blind_and_plans_again_when_it_sees():
    frontend = FakeFrontend(free_port())
    connector = RecordingConnector()
    connector.counts[("stator", "aggregated")] = 3
    config = PlannerConfig(
        profile="unused", adjustment_interval=0.2, min_workers=1, correction=False,
        load_predictor="constant", scale_down_cooldown=0,
    )  # fmt: skip
    planner = PlannerService(
        config,
        PlannerServiceConfig(connector="none"),
        RuntimeConfig(discovery="mem:planner-blind"),
        connector,
        FrontendScraper([frontend.url], model="tiny"),
        profile(),
    )
    await planner.start()
    stop = asyncio.Event()
    loop = asyncio.create_task(planner.run(stop))
    try:
        # Down at start: the loop keeps going, fails repeatedly, holds 3 workers.
        await wait_for(lambda: planner.health.failures >= 3)
        assert not loop.done() and not planner.health.ok
        assert planner.health.up._value.get() == 0
        assert planner.decisions == [] and connector.calls == []

        # Up: a baseline, then intervals with traffic get decisions.
        await frontend.up()
        frontend.serve(2)
        await wait_for(lambda: len(planner.decisions) >= 2)
        assert planner.health.ok and planner.health.up._value.get() == 1

        # Gone again: no more decisions while blind, the fleet stays as it is.
        await frontend.down()
        await wait_for(lambda: not planner.health.ok)
        seen, calls = len(planner.decisions), list(connector.calls)
        await wait_for(lambda: planner.health.failures >= 3)
        assert len(planner.decisions) == seen and connector.calls == calls

        # Back: the first read is a new baseline (the outage is not one interval's
        # traffic), then planning resumes.
        frontend.serve(50)
        await frontend.up()
        await wait_for(lambda: len(planner.decisions) >= seen + 2)
        assert planner.health.ok
        assert all(o.roles[0].requests < 50 for o in planner.observations)
    finally:
        stop.set()
        await asyncio.wait_for(loop, 10)
        await planner.close()
        await frontend.down()


def test_the_planner_process_outlives_an_unreachable_frontend(tmp_path):
    status_port, frontend_port = free_port(), free_port()
    proc = stator_process(
        "planner", "--policy", "load", "--connector", "none", "--adjustment-interval", "0.5",
        "--frontend-url", f"http://127.0.0.1:{frontend_port}", "--metrics-port", str(status_port),
        "--discovery", f"file:{tmp_path / 'discovery'}",
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{status_port}"
        deadline = time.monotonic() + 60
        health = None
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(httpx.HTTPError):
                health = httpx.get(f"{base}/health", timeout=2)
                if health.status_code == 503 and health.json()["failures"] >= 3:
                    break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
        assert health is not None and health.status_code == 503
        assert "no frontend answered" in health.json()["error"]
        assert httpx.get(f"{base}/live", timeout=2).status_code == 200
        metrics = httpx.get(f"{base}/metrics", timeout=2).text
        assert "stator_planner_observation_up 0.0" in metrics
        assert "stator_planner_observation_failures_total" in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out = proc.communicate(timeout=20)[0].decode()
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0].decode()
    assert proc.returncode == 0, out[-2000:]
    # One warning for the outage, not one per retry.
    assert out.count("cannot read traffic") == 1, out[-2000:]
