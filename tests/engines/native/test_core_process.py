"""The native engine with its core in its own process (`--engine-core-process on`): the
same tokens as the in-process engine, batched frames, clean errors, and a core that dies
mid-stream failing its requests (never hanging them)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from stator.engines.base import EngineDead, EngineError
from stator.engines.native import NativeConfig, create_engine, uses_core_process
from stator.engines.native.core_client import CoreProcessEngine
from stator.engines.native.core_stream import RequestStream
from stator.protocols import INVALID_REQUEST, BlockStored, EngineOutput, TokenLogprob
from tests.engines.native.models import greedy_request, prompt

TIMEOUT = 120


def _config(**kw) -> NativeConfig:
    return NativeConfig(device="cpu", dtype="float32", kv_cache_memory="4MiB", cpu_threads=1, **kw)


@pytest.fixture
async def engine(llama):
    model_dir, _ = llama
    eng = create_engine(_config(engine_core_process="on"), str(model_dir), "tiny")
    assert isinstance(eng, CoreProcessEngine)
    eng.worker_id = 17
    await asyncio.wait_for(eng.start(), TIMEOUT)
    yield eng
    await eng.shutdown()


async def collect(eng, request):
    return [out async for out in eng.generate(request)]


def test_auto_keeps_the_core_in_process_on_the_cpu():
    assert not uses_core_process(NativeConfig(device="cpu"))
    assert uses_core_process(NativeConfig(device="cpu", engine_core_process="on"))
    assert not uses_core_process(NativeConfig(engine_core_process="off"))


async def test_tokens_match_the_in_process_engine(engine, llama):
    model_dir, _ = llama
    local = create_engine(_config(), str(model_dir), "tiny")
    await local.start()
    try:
        reqs = [greedy_request(f"r{i}", prompt(40 + i, 9 + 4 * i), 6) for i in range(3)]
        remote = await asyncio.wait_for(
            asyncio.gather(*(collect(engine, r) for r in reqs)), TIMEOUT
        )
        here = await asyncio.wait_for(asyncio.gather(*(collect(local, r) for r in reqs)), TIMEOUT)
    finally:
        await local.shutdown()
    for a, b in zip(remote, here, strict=True):
        assert [t for o in a for t in o.token_ids] == [t for o in b for t in o.token_ids]
        assert a[-1].finish_reason == "length" and a[-1].usage.completion_tokens == 6
    card = engine.model_card()
    assert card.total_kv_blocks == local.model_card().total_kv_blocks
    assert card.context_length == local.model_card().context_length


async def test_load_events_and_kv_state_come_from_the_core(engine):
    events = engine.kv_events()
    first_batch = asyncio.ensure_future(events.__anext__())
    outs = await asyncio.wait_for(collect(engine, greedy_request("a", prompt(1, 40), 3)), TIMEOUT)
    assert outs[0].cached_tokens == 0
    batch = await asyncio.wait_for(first_batch, TIMEOUT)
    assert any(isinstance(e.data, BlockStored) for e in batch)
    assert all(e.worker_id == 17 for e in batch)
    state = await engine.kv_state()
    assert state and isinstance(state[0].data, BlockStored)
    assert engine.load()[0].worker_id == 17
    # The worker's admin op (a router's resync) awaits the core's answer.
    from stator.protocols import AdminRequest
    from stator.worker.admin import AdminOps

    answer = await AdminOps(engine).handle(AdminRequest(op="kv_state"))
    assert answer.ok and answer.result and answer.result[0]["worker_id"] == 17
    await engine.clear_kv()
    assert await engine.kv_state() == []
    await events.aclose()


async def test_abort_ends_the_stream_and_frees_blocks(engine):
    gen = engine.generate(greedy_request("long", prompt(2, 30), 100_000))
    first = await asyncio.wait_for(gen.__anext__(), TIMEOUT)
    assert first.token_ids
    await engine.abort("long")
    rest = [o async for o in gen]
    assert rest[-1].usage.prompt_tokens == 30
    # The core runs on its own: on a starved CPU the request may reach the context limit
    # before the abort lands; it must end either way.
    used = 30 + rest[-1].usage.completion_tokens
    assert rest[-1].finish_reason == "abort" or used >= engine.info.max_total_tokens

    async def freed() -> None:
        while engine.load()[0].num_running or engine.load()[0].active_kv_blocks:
            await asyncio.sleep(0.05)

    # The load the host reports comes with the core's next frame: after the abort landed.
    await collect(engine, greedy_request("after", prompt(3, 5), 1))
    await asyncio.wait_for(freed(), TIMEOUT)


async def test_a_bad_request_is_refused_with_an_invalid_request_error(engine):
    too_long = greedy_request("big", list(range(1, 5000)), 4)
    outs = await asyncio.wait_for(collect(engine, too_long), TIMEOUT)
    assert len(outs) == 1 and outs[0].finish_reason == "error"
    assert outs[0].error_code == INVALID_REQUEST and outs[0].error
    # The core goes on serving.
    ok = await asyncio.wait_for(collect(engine, greedy_request("fine", prompt(4, 8), 2)), TIMEOUT)
    assert ok[-1].finish_reason == "length"


async def test_killing_the_core_fails_requests_in_flight_and_health(engine):
    served = await asyncio.wait_for(collect(engine, greedy_request("ok", prompt(4, 8), 3)), TIMEOUT)
    assert served[-1].finish_reason == "length"
    # Stopped first, so that no request can finish before the kill (the core runs on its
    # own: on a busy CPU it could otherwise outrun the test to the context limit).
    os.kill(engine.proc.pid, signal.SIGSTOP)
    gens = [engine.generate(greedy_request(f"k{i}", prompt(5 + i, 20), 400)) for i in range(3)]
    firsts = [asyncio.ensure_future(gen.__anext__()) for gen in gens]
    await asyncio.sleep(0.3)  # the adds are sent; the core cannot read them
    os.kill(engine.proc.pid, signal.SIGKILL)
    for first in firsts:
        with pytest.raises(EngineDead, match="engine core process exited"):
            await asyncio.wait_for(first, 10)
    with pytest.raises(EngineDead):
        await engine.health_check()
    with pytest.raises(EngineDead):
        await collect(engine, greedy_request("late", prompt(9, 5), 2))


async def test_a_core_that_cannot_start_is_a_clear_error(llama):
    model_dir, _ = llama
    eng = create_engine(
        _config(engine_core_process="on", lora_modules=["x=/no/such/adapter"], enable_lora=True),
        str(model_dir),
        "tiny",
    )
    with pytest.raises(Exception, match="engine core failed to start"):
        await asyncio.wait_for(eng.start(), TIMEOUT)
    assert eng.proc.poll() is not None


async def test_a_slow_reader_gets_the_waiting_deltas_as_one():
    stream = RequestStream(prompt_tokens=3)
    lp = TokenLogprob(token_id=1, logprob=-0.5)
    stream.put(EngineOutput(token_ids=[1], cached_tokens=0))
    stream.put(EngineOutput(token_ids=[2]))
    stream.put(EngineOutput(token_ids=[3], logprobs=[lp]))
    stream.put(EngineOutput(token_ids=[4], logprobs=[lp], finish_reason="length"))
    first = await stream.take()
    assert first.token_ids == [1, 2] and first.cached_tokens == 0 and first.logprobs is None
    last = await stream.take()
    assert last.token_ids == [3, 4] and len(last.logprobs) == 2
    assert last.finish_reason == "length"


def _children(pid: int) -> list[int]:
    from pathlib import Path

    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


async def test_tensor_parallel_ranks_live_under_the_core_process_and_die_with_it(llama):
    model_dir, _ = llama
    request = greedy_request("tp", prompt(11, 12), 5)
    local = create_engine(_config(), str(model_dir), "tiny")
    await local.start()
    try:
        expected = await asyncio.wait_for(collect(local, request), TIMEOUT)
    finally:
        await local.shutdown()
    eng = create_engine(
        _config(engine_core_process="on", tensor_parallel_size=2), str(model_dir), "tiny"
    )
    await asyncio.wait_for(eng.start(), TIMEOUT)
    try:
        got = await asyncio.wait_for(collect(eng, request), TIMEOUT)
        assert [t for o in got for t in o.token_ids] == [t for o in expected for t in o.token_ids]
        ranks = _children(eng.proc.pid)
        assert len(ranks) == 1  # rank 1, started by the core process (rank 0)
        os.kill(eng.proc.pid, signal.SIGKILL)
        deadline = asyncio.get_running_loop().time() + 30
        while os.path.exists(f"/proc/{ranks[0]}") and _state(ranks[0]) != "Z":
            assert asyncio.get_running_loop().time() < deadline, "rank 1 outlived its core"
            await asyncio.sleep(0.1)
    finally:
        await eng.shutdown()


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


async def test_lora_loads_and_unloads_in_the_core_process(llama, tmp_path):
    pytest.importorskip("peft")
    from tests.engines.native.lora_adapters import build_adapter
    from tests.engines.native.models import hf_greedy

    model_dir, hf = llama
    ref = build_adapter(hf, tmp_path / "a1", seed=10)[1]
    eng = create_engine(
        _config(engine_core_process="on", enable_lora=True, lora_allowed_dirs=[str(tmp_path)]),
        str(model_dir),
        "tiny",
    )
    await asyncio.wait_for(eng.start(), TIMEOUT)
    try:
        info = await eng.load_lora("a1", str(tmp_path / "a1"))
        assert info.name == "a1" and [i.name for i in eng.model_card().loras] == ["a1"]
        ids = prompt(3, 12)
        req = greedy_request("r1", ids, 5)
        req.model = "a1"  # the adapter's own card names it
        outs = await asyncio.wait_for(collect(eng, req), TIMEOUT)
        assert [t for o in outs for t in o.token_ids] == hf_greedy(ref, ids, 5)
        await eng.unload_lora("a1")
        assert eng.list_loras() == []
        with pytest.raises(EngineError, match="not loaded"):
            await eng.unload_lora("a1")
        with pytest.raises(EngineError):  # outside the allowed directories
            await eng.load_lora("a2", "/etc")
        late = greedy_request("r2", ids, 5)
        late.lora_name = "a1"
        refused = await asyncio.wait_for(collect(eng, late), TIMEOUT)
        assert refused[-1].finish_reason == "error" and "not loaded" in refused[-1].error
    finally:
        await eng.shutdown()


async def test_sleep_and_wake_in_the_core_process(llama):
    model_dir, _ = llama
    eng = create_engine(
        _config(engine_core_process="on", enable_sleep_mode=True), str(model_dir), "tiny"
    )
    await asyncio.wait_for(eng.start(), TIMEOUT)
    try:
        ids = prompt(9, 20)
        before = await asyncio.wait_for(collect(eng, greedy_request("a", ids, 6)), TIMEOUT)
        await eng.sleep(1)
        assert eng.is_sleeping()
        with pytest.raises(EngineError, match="asleep"):
            await collect(eng, greedy_request("b", ids, 6))
        await eng.wake(["weights"])  # one part back: still asleep
        assert eng.is_sleeping()
        await eng.wake(["kv_cache"])
        assert not eng.is_sleeping()
        again = await asyncio.wait_for(collect(eng, greedy_request("c", ids, 6)), TIMEOUT)
        # (Deltas may arrive merged: compare the tokens.)
        assert [t for o in again for t in o.token_ids] == [t for o in before for t in o.token_ids]
    finally:
        await eng.shutdown()


async def test_start_waits_for_the_cores_input_connection(tmp_path):
    """A core that says ready before its input connect has completed: `start` waits until
    the host's PUSH socket has a peer (until then a NOBLOCK send fails with EAGAIN and a
    request's frame is lost), and gives up with an EngineError if the core exits first."""
    import zmq

    from stator.engines.native.core_launch import CoreProcess

    core = CoreProcess()
    ctx = zmq.Context()
    core._push = ctx.socket(zmq.PUSH)
    core._push.setsockopt(zmq.SNDHWM, 0)
    address = f"ipc://{tmp_path}/inputs"
    core._push.bind(address)
    with pytest.raises(zmq.Again):  # what the host's send met on a loaded box
        core._push.send(b"lost", zmq.NOBLOCK)
    exited = asyncio.get_running_loop().create_future()
    waiting = asyncio.ensure_future(core._input_connected(exited))
    await asyncio.sleep(0.2)
    assert not waiting.done()  # no peer yet: still waiting
    peer = ctx.socket(zmq.PULL)
    peer.connect(address)  # the core's late connect
    await asyncio.wait_for(waiting, TIMEOUT)
    core._push.send(b"frame", zmq.NOBLOCK)
    assert peer.recv() == b"frame"
    peer.close(0)

    lonely = CoreProcess()
    lonely._push = ctx.socket(zmq.PUSH)
    lonely._push.bind(f"ipc://{tmp_path}/other")
    gone = asyncio.get_running_loop().create_future()
    gone.set_result(None)
    with pytest.raises(EngineError, match="exited"):
        await lonely._input_connected(gone)
    core._push.close(0)
    lonely._push.close(0)
    ctx.term()
