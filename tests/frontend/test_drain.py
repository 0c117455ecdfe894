"""`stator frontend` under the runtime's Lifecycle (`FrontendDrain`): a stop lets in-flight
streams finish and exits 0; a stop whose grace runs out cuts them; a frontend that cannot
serve exits 1. In-process: a real frontend (uvicorn on a free port) and a worker runtime
serving the ScriptedEngine test double on mem discovery."""

from __future__ import annotations

import asyncio
import socket

import httpx

from stator.frontend import FrontendConfig
from stator.frontend.http.drain import FrontendDrain
from stator.frontend.server import serve_frontend
from stator.protocols import EngineRequest
from stator.router import RouterConfig
from stator.runtime import Lifecycle, Runtime, RuntimeConfig
from tests.fakes import ScriptedEngine
from tests.frontend.harness import engine_handler
from tests.procs import free_port

MODEL = "drain/scripted"


async def _worker(model_dir, store: str, tokens: int, delay: float) -> Runtime:
    engine = ScriptedEngine(MODEL, script=list(range(100, 100 + tokens)), delay=delay)
    worker = await Runtime.create(RuntimeConfig(discovery=f"mem:{store}"))
    await worker.serve("stator.drain.generate", engine_handler(engine), EngineRequest)
    card = engine.model_card()
    card.source_path = str(model_dir)
    await worker.publish_model_card("stator.drain.generate", card)
    return worker


async def _start(store: str, port: int, grace: float) -> tuple[Lifecycle, asyncio.Task]:
    runtime = await Runtime.create(RuntimeConfig(discovery=f"mem:{store}"))
    stop = asyncio.Event()
    config = FrontendConfig(http_host="127.0.0.1", http_port=port, model_wait_timeout=30)
    serving = asyncio.ensure_future(
        serve_frontend(runtime, config, RouterConfig(), stop=stop, handle_signals=False)
    )
    lifecycle = Lifecycle(FrontendDrain(runtime, stop, serving), grace=grace, signals=())
    return lifecycle, asyncio.create_task(lifecycle.run(serving))


async def _stream_while_stopping(
    base: str, lifecycle: Lifecycle, stop_after_events: int
) -> tuple[list[str], bool]:
    """Stream a chat; after `stop_after_events` events ask the lifecycle to stop. The
    events received, and whether the stream ended with [DONE]."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    events: list[str] = []
    done = False
    url = f"{base}/v1/chat/completions"
    async with (
        httpx.AsyncClient(timeout=30) as client,
        client.stream("POST", url, json=body) as resp,
    ):
        assert resp.status_code == 200
        try:
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                events.append(line)
                if len(events) == stop_after_events:
                    lifecycle.request_stop("test stop")
        except httpx.HTTPError:
            pass  # the server cut the stream
    return events, done


async def test_stop_lets_an_inflight_stream_finish_and_exits_0(tiny_model_dir):
    worker = await _worker(tiny_model_dir, "drain-finish", tokens=12, delay=0.05)
    port = free_port()
    lifecycle, run = await _start("drain-finish", port, grace=20)
    try:
        events, done = await _stream_while_stopping(f"http://127.0.0.1:{port}", lifecycle, 2)
        assert done, "the stream in flight at the stop was cut"
        assert len(events) >= 12  # role chunk + a chunk per token (+ the finish chunk)
        assert await asyncio.wait_for(run, 30) == 0
        # Stopped: no new connections.
        async with httpx.AsyncClient(timeout=5) as client:
            try:
                await client.get(f"http://127.0.0.1:{port}/live")
                raise AssertionError("the frontend still answers after stopping")
            except httpx.TransportError:
                pass
    finally:
        await worker.shutdown(0)


async def test_stop_cuts_streams_when_the_grace_runs_out(tiny_model_dir):
    worker = await _worker(tiny_model_dir, "drain-cut", tokens=200, delay=0.05)
    port = free_port()
    lifecycle, run = await _start("drain-cut", port, grace=0.5)
    try:
        events, done = await _stream_while_stopping(f"http://127.0.0.1:{port}", lifecycle, 2)
        assert not done and len(events) < 100  # 200 tokens would take 10 s
        assert await asyncio.wait_for(run, 30) == 0
    finally:
        await worker.shutdown(0)


async def test_a_frontend_that_cannot_serve_exits_1():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        _, run = await _start("drain-taken", port, grace=1)
        assert await asyncio.wait_for(run, 30) == 1
