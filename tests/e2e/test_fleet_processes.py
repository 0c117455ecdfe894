"""A frontend process and mocker worker processes find each other through real discovery
(file, or etcd + NATS), survive a `kill -9` of one worker, and drain on SIGTERM."""

from __future__ import annotations

import contextlib
import json
import signal
import time

import httpx
import pytest

from tests.e2e.fleet import Fleet, live_instances, wait_until
from tests.runtime.cluster import etcd_server, nats_server

pytestmark = pytest.mark.integration


@pytest.fixture(params=["file+zmq", "etcd+nats"])
def planes(request, tmp_path):
    with contextlib.ExitStack() as stack:
        if request.param == "file+zmq":
            yield f"file:{tmp_path / 'discovery'}", "zmq"
        else:
            etcd = stack.enter_context(etcd_server(tmp_path))
            nats = stack.enter_context(nats_server(tmp_path))
            yield f"etcd://{etcd}", nats


@pytest.fixture
def fleet(tmp_path):
    f = Fleet(tmp_path)
    yield f
    f.close()


def chat(base_url: str, max_tokens: int = 8) -> dict:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    resp = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_frontend_and_workers_find_each_other_survive_kill_and_drain(planes, fleet):
    discovery, events = planes
    frontend, url = fleet.frontend(discovery, events)
    a = fleet.mocker_worker(discovery, events, "--speedup-ratio", "10")
    b = fleet.mocker_worker(discovery, events, "--speedup-ratio", "1")
    procs = [frontend, a, b]
    wait_until(lambda: len(live_instances(url, "tiny")) == 2, 60, "two workers", procs)
    for _ in range(4):
        assert chat(url)["usage"]["completion_tokens"] == 8

    # kill -9: its discovery entry expires within the TTL and the other keeps serving.
    a.signal(signal.SIGKILL)
    start = time.monotonic()
    wait_until(
        lambda: len(live_instances(url, "tiny")) == 1, 10, "the killed worker to go", [frontend, b]
    )
    assert time.monotonic() - start < 2 + 4  # TTL 2 s, plus polling slack on a busy box
    for _ in range(3):
        assert chat(url)["usage"]["completion_tokens"] == 8

    # SIGTERM mid-stream: the worker unregisters, finishes the stream, exits 0.
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "long"}],
        "max_tokens": 120,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    tokens, usage, done = 0, None, False
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                tokens += 1
                if tokens == 3:
                    b.signal(signal.SIGTERM)
            if chunk.get("usage"):
                usage = chunk["usage"]
    assert done and usage["completion_tokens"] == 120
    assert b.wait(30) == 0, b.output()[-2000:]
    wait_until(lambda: not live_instances(url, "tiny"), 10, "no workers", [frontend])
    resp = httpx.post(
        f"{url}/v1/chat/completions",
        timeout=30,
        json={"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
    )
    assert resp.status_code in (404, 503), resp.text
    assert "error" in resp.json()
