"""A vLLM engine whose EngineCore is killed: the engine reports `EngineDead` everywhere
the worker host looks (health check, KV event stream, new requests). On a tiny Qwen3."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from tests.engines.vllm.conftest import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

import psutil

from stator.engines.base import EngineDead
from stator.engines.vllm import VllmConfig, create_engine
from tests.engines.vllm.helpers import (
    TEST_ENGINE_ARGS,
    collect,
    greedy_request,
    tokens,
)

pytestmark = pytest.mark.integration


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


async def test_qwen3_serves_then_dies_with_engine_dead(qwen3_dir, offline_vllm):
    before = children()
    engine = create_engine(
        VllmConfig.make(
            {**TEST_ENGINE_ARGS, "scheduling_policy": "priority"}, engine_monitor_interval=0.5
        ),
        str(qwen3_dir),
        "qwen",
    )
    await engine.start()
    try:
        out = await collect(engine.generate(greedy_request("q-1", [1, 20, 30, 40], max_tokens=6)))
        assert len(tokens(out)) == 6 and out[-1].finish_reason == "length"
        offline = await asyncio.to_thread(offline_vllm.greedy, qwen3_dir, [1, 20, 30, 40], 6)
        assert tokens(out) == offline
        await engine.health_check()
        urgent = greedy_request("q-prio", [1, 20, 30, 40], max_tokens=6)
        urgent.priority = 5  # reaches vLLM's priority scheduler (as -5)
        assert tokens(await collect(engine.generate(urgent))) == offline
        prompt = [1, 20, 30, 40, 50]
        lp = await collect(engine.generate(greedy_request("q-lp", prompt, 2, prompt_logprobs=1)))
        prompt_lps = lp[0].prompt_logprobs
        assert prompt_lps is not None and len(prompt_lps) == len(prompt)
        assert prompt_lps[0] is None
        assert [p.token_id for p in prompt_lps[1:]] == prompt[1:]
        assert all(len(p.top) == 1 for p in prompt_lps[1:])
        events = engine.kv_events()
        watcher = asyncio.create_task(collect(events))
        spawned = children() - before
        assert spawned, "vLLM started no EngineCore process"
        for pid in spawned:
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(EngineDead):
            await asyncio.wait_for(watcher, timeout=60)
        with pytest.raises(EngineDead):
            await engine.health_check()
        with pytest.raises(EngineDead):
            await collect(engine.generate(greedy_request("q-2", [1, 2, 3])))
    finally:
        await engine.shutdown()
