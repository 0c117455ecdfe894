"""The batched progress callback and the event loop the CLI runs on."""

import asyncio

import pytest

from stator.bench.metrics import client_cpu
from stator.bench.progress import Batched
from stator.bench.runner import loop_factory


def test_batched_passes_counts_on_at_most_once_per_interval():
    now = [0.0]
    calls: list[int] = []
    advance = Batched(calls.append, interval=1.0, clock=lambda: now[0])
    for _ in range(5):
        advance(1)
    assert calls == []
    now[0] = 1.0
    advance(2)
    assert calls == [7]
    advance(1)
    now[0] = 1.5
    advance(1)
    assert calls == [7]  # within the interval of the last call
    advance.flush()
    assert calls == [7, 2]
    advance.flush()
    assert calls == [7, 2]  # nothing left


def test_client_runs_on_uvloop_when_installed():
    uvloop = pytest.importorskip("uvloop")
    factory = loop_factory()
    assert factory is not None
    loop = factory()
    try:
        assert isinstance(loop, uvloop.Loop)
        assert loop.run_until_complete(asyncio.sleep(0, "ok")) == "ok"
    finally:
        loop.close()


def test_client_cpu_per_request():
    row = client_cpu(0.3, 0.1, 400)
    assert row["unit"] == "ms"
    assert row["avg"] == pytest.approx(1.0) and row["user"] == pytest.approx(0.75)
    assert client_cpu(0.0, 0.0, 0)["avg"] == 0.0
