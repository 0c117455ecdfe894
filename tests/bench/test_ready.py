"""`stator bench run --ready-check-timeout-sec` and `--api-key`: wait for /health and the
model before measuring, with the key on every request."""

from __future__ import annotations

import pytest
from aiohttp import web

from stator.bench.http import HttpClient
from stator.bench.ready import wait_until_ready


async def _server(state: dict) -> tuple[web.AppRunner, str]:
    async def health(request: web.Request) -> web.Response:
        state["auth"].append(request.headers.get("Authorization"))
        state["polls"] += 1
        ok = state["polls"] > state["unhealthy_polls"]
        return web.json_response({}, status=200 if ok else 503)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": m} for m in state["models"]]})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def server():
    state = {"polls": 0, "unhealthy_polls": 2, "models": ["m"], "auth": []}
    runner, url = await _server(state)
    yield state, url
    await runner.cleanup()


async def test_waits_until_healthy_and_the_model_is_listed(server):
    state, url = server
    http = HttpClient(url, timeout=5, headers={"Authorization": "Bearer k"})
    await wait_until_ready(http, url, "m", timeout=10, interval=0.01)
    http.close()
    assert state["polls"] == 3
    assert state["auth"] == ["Bearer k"] * 3


async def test_times_out_naming_what_is_missing(server):
    state, url = server
    state["unhealthy_polls"] = 0
    http = HttpClient(url, timeout=5)
    with pytest.raises(RuntimeError, match=r"not ready after 0.2 s: .*lists \['m'\], not 'other'"):
        await wait_until_ready(http, url, "other", timeout=0.2, interval=0.05)
    http.close()


async def test_a_server_that_is_not_up_yet_is_waited_for_too():
    http = HttpClient("http://127.0.0.1:9", timeout=1)
    with pytest.raises(RuntimeError, match="cannot connect"):
        await wait_until_ready(http, "http://127.0.0.1:9", None, timeout=0.1, interval=0.05)
