import asyncio
import json
import time

import pytest

from stator.engines.base import EngineDead, EngineError
from stator.engines.mocker import MockerConfig, create_engine
from stator.kv.hashing import block_hashes
from stator.protocols import (
    AllCleared,
    BlockStored,
    DisaggParams,
    EngineRequest,
    RoutingHints,
    SamplingOptions,
    StopConditions,
)

BS = 16


@pytest.fixture
async def make_engine(tiny_model_dir):
    engines = []

    async def make(**kw):
        kw.setdefault("block_size", BS)
        kw.setdefault("speedup_ratio", 0.0)
        engine = create_engine(MockerConfig(**kw), str(tiny_model_dir), "tiny")
        engine.worker_id = 42
        await engine.start()
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        await engine.shutdown()


def request(rid="r", tokens=None, **stop) -> EngineRequest:
    seed = stop.pop("seed", None)
    return EngineRequest(
        request_id=rid,
        model="tiny",
        token_ids=list(range(100, 140)) if tokens is None else tokens,
        sampling=SamplingOptions(seed=seed),
        stop=StopConditions(**stop),
    )


async def collect(engine, req):
    return [out async for out in engine.generate(req)]


def tokens_of(outs):
    return [t for out in outs for t in out.token_ids]


async def test_streams_tokens_with_usage_on_the_last(make_engine):
    engine = await make_engine()
    outs = await collect(engine, request(max_tokens=5))
    assert len(tokens_of(outs)) == 5
    assert outs[-1].finish_reason == "length"
    assert outs[-1].usage.prompt_tokens == 40 and outs[-1].usage.completion_tokens == 5
    assert outs[0].cached_tokens == 0
    assert all(o.finish_reason is None for o in outs[:-1])


async def test_random_tokens_are_deterministic_per_seed(make_engine):
    engine = await make_engine()
    a = tokens_of(await collect(engine, request("a", max_tokens=8, seed=3)))
    b = tokens_of(await collect(engine, request("b", max_tokens=8, seed=3)))
    c = tokens_of(await collect(engine, request("c", max_tokens=8)))
    c2 = tokens_of(await collect(engine, request("c", max_tokens=8)))
    assert a == b and c == c2 and a != c
    assert all(1000 <= t < 2000 for t in a)  # the tiny model's vocabulary is 2000


async def test_repeated_prompt_reports_cached_tokens(make_engine):
    engine = await make_engine()
    first = await collect(engine, request("a", max_tokens=2))
    second = await collect(engine, request("b", max_tokens=2))
    assert first[0].cached_tokens == 0
    assert second[0].cached_tokens == 32  # 2 full blocks; the last token is computed
    assert second[-1].usage.cached_tokens == 32


async def test_kv_events_carry_the_shared_hashes(make_engine):
    engine = await make_engine()
    prompt = list(range(100, 140))
    await collect(engine, request(tokens=prompt, max_tokens=1))
    events = await asyncio.wait_for(anext(engine.kv_events()), 5)
    stored = events[0].data
    assert isinstance(stored, BlockStored)
    assert stored.block_hashes == block_hashes(prompt, BS)
    assert stored.token_ids == prompt[:32]
    assert events[0].worker_id == 42
    state = engine.kv_state()
    assert [e.data.block_hashes[0] for e in state] == block_hashes(prompt, BS)
    await engine.clear_kv()
    cleared = await asyncio.wait_for(anext(engine.kv_events()), 5)
    assert cleared[-1].data == AllCleared()
    assert engine.kv_state() == []


async def test_speedup_zero_does_not_sleep(make_engine):
    engine = await make_engine(speedup_ratio=0.0)
    # At speedup 1 these would take about 500 steps × 6 ms = 3 s of simulated time.
    started = time.perf_counter()
    await asyncio.gather(
        *[collect(engine, request(f"r{i}", max_tokens=500, seed=i)) for i in range(8)]
    )
    assert time.perf_counter() - started < 2.5


async def test_speedup_one_takes_simulated_time(make_engine):
    engine = await make_engine(speedup_ratio=1.0)
    started = time.perf_counter()
    outs = await collect(engine, request(max_tokens=10))
    elapsed = time.perf_counter() - started
    # One prefill step (17.1 ms: 40 new tokens, no decode term) and nine decode steps
    # (5.74 ms each at an almost empty cache): 68.8 ms of simulated time.
    assert elapsed >= 0.065
    assert len(tokens_of(outs)) == 10


async def test_visible_and_hidden_stop_tokens(make_engine):
    engine = await make_engine(output_mode="echo")
    prompt = [5, 6, 7, 8, 9]
    visible = await collect(engine, request("v", prompt, stop_token_ids=[7]))
    assert tokens_of(visible) == [5, 6, 7]
    assert visible[-1].finish_reason == "stop" and visible[-1].stop_token_id == 7
    hidden = await collect(engine, request("h", prompt, stop_token_ids_hidden=[7]))
    assert tokens_of(hidden) == [5, 6]
    assert hidden[-1].stop_token_id == 7 and hidden[-1].usage.completion_tokens == 3
    ignored = await collect(
        engine, request("i", prompt, stop_token_ids_hidden=[7], ignore_eos=True, max_tokens=6)
    )
    assert tokens_of(ignored) == [5, 6, 7, 8, 9, 5]
    assert ignored[-1].finish_reason == "length"


async def test_min_tokens_defers_stop(make_engine):
    engine = await make_engine(output_mode="echo")
    outs = await collect(engine, request("m", [5, 6, 7, 8], stop_token_ids=[7], min_tokens=4))
    assert tokens_of(outs) == [5, 6, 7, 8, 5, 6, 7]


async def test_max_tokens_defaults_to_the_rest_of_the_context(make_engine):
    engine = await make_engine()
    context = engine.model_card().context_length
    outs = await collect(engine, request(tokens=[9] * (context - 3)))
    assert len(tokens_of(outs)) == 3 and outs[-1].finish_reason == "length"


@pytest.mark.parametrize(
    ("req", "message"),
    [
        (request(tokens=[]), "empty prompt"),
        (request(max_tokens=0), "max_tokens"),
        (request(tokens=[1] * 5000), "context length"),
        (EngineRequest(request_id="l", model="tiny", token_ids=[1], lora_name="x"), "LoRA"),
    ],
)
async def test_bad_requests_are_rejected(make_engine, req, message):
    engine = await make_engine()
    with pytest.raises(EngineError, match=message):
        await collect(engine, req)


async def test_request_larger_than_the_cache_is_rejected(make_engine):
    engine = await make_engine(num_gpu_blocks=4)
    with pytest.raises(EngineError, match="KV cache"):
        await collect(engine, request(max_tokens=100))


async def test_abort_frees_blocks_and_ends_the_stream(make_engine):
    engine = await make_engine(speedup_ratio=1.0)
    stream = engine.generate(request("a", max_tokens=1000))
    first = await anext(stream)
    assert first.token_ids
    assert engine.load()[0].active_kv_blocks > 0
    await engine.abort("a")
    assert engine.load()[0].active_kv_blocks == 0
    rest = [out async for out in stream]
    assert rest[-1].finish_reason == "abort"


async def test_closing_the_stream_frees_blocks(make_engine):
    engine = await make_engine(speedup_ratio=1.0)
    stream = engine.generate(request("a", max_tokens=1000))
    await anext(stream)
    await stream.aclose()
    report = engine.load()[0]
    assert report.active_kv_blocks == 0 and report.num_running == 0


async def test_load_report_counts_running_and_waiting(make_engine):
    engine = await make_engine(speedup_ratio=1.0, max_num_seqs=1)
    streams = [engine.generate(request(f"r{i}", max_tokens=100)) for i in range(3)]
    await anext(streams[0])
    tasks = [asyncio.ensure_future(anext(s)) for s in streams[1:]]
    await asyncio.sleep(0.02)
    report = engine.load()[0]
    assert report.worker_id == 42 and report.total_kv_blocks == 16384
    assert report.num_running == 1 and report.num_waiting == 2
    assert report.queued_prefill_tokens == 80
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for s in streams:
        await s.aclose()


async def test_prefill_role_returns_one_token_and_disagg_params(make_engine):
    engine = await make_engine(role="prefill")
    assert engine.model_card().role == "prefill"
    outs = await collect(engine, request(max_tokens=50))
    assert len(tokens_of(outs)) == 1
    disagg = outs[-1].disagg
    assert disagg.prefill_worker_id == 42 and disagg.num_prompt_tokens == 40
    assert disagg.remote_block_ids == block_hashes(list(range(100, 140)), BS)


async def test_decode_role_waits_for_the_kv_transfer(make_engine):
    # KV bytes per token come from the tiny config.json; a 1e-4 GB/s link makes the
    # transfer clearly visible.
    engine = await make_engine(role="decode", speedup_ratio=1.0, kv_transfer_bandwidth=1e-4)
    expected = engine.kv_copies.transfer_seconds(40)
    assert expected > 0.05
    req = request(max_tokens=2)
    req.disagg = DisaggParams(prefill_worker_id=1, num_prompt_tokens=40)
    started = time.perf_counter()
    outs = await collect(engine, req)
    assert time.perf_counter() - started >= expected
    assert len(tokens_of(outs)) == 2
    # The pulled KV is in the decode worker's cache, announced as stored.
    state = engine.kv_state()
    assert [e.data.block_hashes[0] for e in state][:2] == block_hashes(list(range(100, 140)), BS)


async def test_data_parallel_ranks_have_their_own_cache(make_engine):
    engine = await make_engine(data_parallel_size=2)
    req = request("a", max_tokens=1)
    req.routing = RoutingHints(dp_rank=1)
    await collect(engine, req)
    reports = engine.load()
    assert [r.dp_rank for r in reports] == [0, 1]
    assert {e.dp_rank for e in engine.kv_state()} == {1}


async def test_preemption_under_a_small_cache_still_completes_every_request(make_engine):
    # 12 blocks of 16 tokens: 6 requests of 40 + 30 tokens cannot all run at once.
    engine = await make_engine(num_gpu_blocks=12)
    reqs = [request(f"p{i}", [i + 10] * 40, max_tokens=30, seed=i) for i in range(6)]
    results = await asyncio.gather(*[collect(engine, r) for r in reqs])
    assert [len(tokens_of(outs)) for outs in results] == [30] * 6
    assert engine.metrics()["mocker_preemptions_total"] > 0
    # ... and as the worker's stator_worker_preemptions_total (stator.worker.metrics)
    assert engine.metrics()["preemptions_total"] == engine.metrics()["mocker_preemptions_total"]
    assert engine.load()[0].active_kv_blocks == 0


async def test_startup_time_is_spent_in_start(tiny_model_dir):
    engine = create_engine(MockerConfig(startup_time=0.2), str(tiny_model_dir), "tiny")
    started = time.perf_counter()
    await engine.start()
    assert time.perf_counter() - started >= 0.2
    await engine.shutdown()


async def test_not_started_engine_rejects_requests(tiny_model_dir):
    engine = create_engine(MockerConfig(), str(tiny_model_dir), "tiny")
    with pytest.raises(EngineError, match="not started"):
        await collect(engine, request())


async def test_a_crashed_step_loop_fails_streams_and_health(make_engine, monkeypatch):
    engine = await make_engine()

    def broken():
        raise RuntimeError("boom")

    monkeypatch.setattr(engine.ranks[0].scheduler, "schedule", broken)
    outs = await asyncio.wait_for(collect(engine, request()), 5)
    assert outs[-1].finish_reason == "error" and "boom" in outs[-1].error
    with pytest.raises(EngineDead):
        await engine.health_check()


async def test_without_chunked_prefill_a_request_must_fit_one_step(make_engine):
    engine = await make_engine(enable_chunked_prefill=False, max_num_batched_tokens=64)
    with pytest.raises(EngineError, match="chunked prefill is off"):
        await collect(engine, request(max_tokens=30))
    outs = await collect(engine, request(max_tokens=20))
    assert len(tokens_of(outs)) == 20


async def test_profile_file_drives_step_time(make_engine, tmp_path):
    profile = {
        "prefill": {"tokens": [1, 10000], "ms": [100.0, 100.0]},
        "decode": {"batch_size": [1, 256], "context": [1, 100000], "ms": [[1, 1], [1, 1]]},
    }
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    engine = await make_engine(speedup_ratio=1.0, profile=str(path))
    started = time.perf_counter()
    outs = await collect(engine, request(max_tokens=3))
    elapsed = time.perf_counter() - started
    assert len(tokens_of(outs)) == 3
    assert elapsed >= 0.1  # one 100 ms prefill step, then two 1 ms decode steps


async def test_bad_profile_file_fails_at_creation(tiny_model_dir, tmp_path):
    path = tmp_path / "profile.json"
    path.write_text("[]")
    with pytest.raises(ValueError, match="profile"):
        create_engine(MockerConfig(profile=str(path)), str(tiny_model_dir), "tiny")


async def test_logprobs_have_the_shape_a_real_engine_gives(make_engine):
    import msgspec

    engine = await make_engine()
    req = request("lp", max_tokens=6)
    req = msgspec.structs.replace(req, sampling=SamplingOptions(logprobs=3))
    outs = await collect(engine, req)
    logprobs = [lp for out in outs for lp in (out.logprobs or [])]
    assert [lp.token_id for lp in logprobs] == tokens_of(outs)
    for lp in logprobs:
        assert lp.logprob < 0 and len(lp.top) == 3
        assert lp.top[0].token_id == lp.token_id
        assert [t.logprob for t in lp.top] == sorted((t.logprob for t in lp.top), reverse=True)
    plain = await collect(engine, request("plain", max_tokens=2))
    assert all(out.logprobs is None for out in plain)


async def test_guided_decoding_is_refused_not_ignored(make_engine):
    import msgspec

    from stator.protocols import GuidedDecoding

    engine = await make_engine()
    guided = SamplingOptions(guided_decoding=GuidedDecoding(json_object=True))
    req = msgspec.structs.replace(request("g", max_tokens=2), sampling=guided)
    with pytest.raises(EngineError, match="guided"):
        await collect(engine, req)
