"""The local connector on real processes: it starts `stator worker`s with GPU ids handed
out one set per worker, and a scale-down drains (the worker leaves discovery, finishes
its streams, exits 0), so no in-flight request fails; a freed GPU id is handed out again."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest

from stator.planner.connectors.local import LocalConnector
from tests.e2e.fleet import BUNDLED, Fleet, live_instances, wait_until
from tests.procs import repo_env

pytestmark = pytest.mark.integration

TOKENS = 120


def cuda_devices(pid: int) -> str | None:
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if item.startswith(b"CUDA_VISIBLE_DEVICES="):
            return item.split(b"=", 1)[1].decode()
    return None


async def stream(http: httpx.AsyncClient, url: str, started: asyncio.Event | None = None) -> int:
    """Completion tokens of one streamed request; raises on any error. `started` is set
    with its first token."""
    body = {"model": "tiny", "prompt": "hello there", "max_tokens": TOKENS, "stream": True,
            "ignore_eos": True}  # fmt: skip
    tokens = 0
    async with http.stream("POST", f"{url}/v1/completions", json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            assert "error" not in chunk, chunk
            tokens += 1
            if started is not None:
                started.set()
    return tokens


async def test_scale_up_assigns_gpus_and_scale_down_drains_without_failing_a_request(tmp_path):
    discovery = f"file:{tmp_path / 'discovery'}"
    fleet = Fleet(tmp_path)
    # ~50 ms per token: a 120-token stream outlives the drain signal by seconds.
    flags = [
        "--engine", "mocker", "--model", str(BUNDLED), "--served-model-name", "tiny",
        "--discovery", discovery, "--event-plane", "zmq", "--discovery-ttl", "2",
        "--graceful-shutdown-timeout", "60", "--speedup-ratio", "0.12",
    ]  # fmt: skip
    connector = LocalConnector(
        {("stator", "aggregated"): flags}, gpus=["0", "1", "2"], env=repo_env(),
        log_dir=tmp_path / "workers",
    )  # fmt: skip
    try:
        frontend, url = fleet.frontend(discovery, "zmq", "--router-mode", "round-robin")
        await connector.scale("stator", "aggregated", 2)
        first, second = connector.workers
        assert (first.gpus, second.gpus) == (["0"], ["1"])
        assert cuda_devices(first.proc.pid) == "0" and cuda_devices(second.proc.pid) == "1"
        await asyncio.to_thread(
            wait_until, lambda: len(live_instances(url, "tiny")) == 2, 90, "two workers",
            [frontend],
        )  # fmt: skip

        async with httpx.AsyncClient(timeout=120) as http:
            started = [asyncio.Event() for _ in range(4)]
            streams = [asyncio.create_task(stream(http, url, s)) for s in started]
            # Every stream has its first token (so runs on one of the two) before the drain:
            # on a loaded box the requests may not even have been sent a second later.
            await asyncio.wait_for(asyncio.gather(*(s.wait() for s in started)), 60)
            assert not any(s.done() for s in streams)
            await connector.scale("stator", "aggregated", 1)  # drains the newest
            assert second.draining and await connector.current("stator", "aggregated") == 1
            assert await asyncio.gather(*streams) == [TOKENS] * 4
        assert await asyncio.to_thread(second.proc.wait, 60) == 0
        await asyncio.to_thread(
            wait_until, lambda: len(live_instances(url, "tiny")) == 1, 30, "one worker"
        )

        await connector.scale("stator", "aggregated", 2)
        assert connector.workers[-1].gpus == ["1"]  # the drained worker's id, free again
        assert connector.worker_seconds() > 0
    finally:
        await connector.close(grace=30)
        fleet.close()


async def test_a_worker_is_charged_until_its_process_exits_not_until_the_next_look(tmp_path):
    # A worker that exits at once (a flag it does not know): the connector is next asked
    # two seconds later, and the worker's life still ends when its process did.
    connector = LocalConnector({("p", "aggregated"): ["--no-such-flag"]}, env=repo_env())
    await connector.scale("p", "aggregated", 1)
    (worker,) = connector.workers
    deadline = asyncio.get_running_loop().time() + 60
    while worker.proc.poll() is None:
        assert asyncio.get_running_loop().time() < deadline, "the worker never exited"
        await asyncio.sleep(0.05)
    seen_exit = time.monotonic()
    await asyncio.sleep(2.0)
    looked = time.monotonic()
    assert await connector.current("p", "aggregated") == 0
    assert worker.stopped is not None and worker.stopped <= seen_exit + 0.5 < looked
    assert connector.worker_seconds(looked) < looked - worker.started - 1.0
    await connector.close()
    assert not connector._exit_watches
