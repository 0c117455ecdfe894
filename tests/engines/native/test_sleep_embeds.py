"""Sleep/wake and prompt embeddings in the native engine (CPU)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
import torch

from stator.engines.base import EngineError, Unsupported
from stator.engines.native import NativeConfig, create_engine
from tests.engines.native.models import (
    core_for,
    greedy_request,
    hf_greedy,
    prompt,
    run_all,
    tokens_of,
)

TIMEOUT = 60


async def engine_for(model_dir, **overrides):
    values = dict(device="cpu", dtype="float32", kv_cache_memory="4MiB", enable_sleep_mode=True)
    engine = create_engine(NativeConfig(**{**values, **overrides}), str(model_dir), "tiny")
    await engine.start()
    return engine


async def tokens(engine, request):
    return [t async for out in engine.generate(request) for t in out.token_ids]


def device_bytes(core) -> int:
    model = core.runner.model
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return params + core.runner.kv_pool.numel() * core.runner.kv_pool.element_size()


@pytest.mark.parametrize("level", [1, 2])
async def test_sleep_frees_weights_and_kv_and_wake_restores_outputs(llama, level):
    model_dir, hf = llama
    engine = await engine_for(model_dir)
    try:
        ids = prompt(9, 20)
        before = await tokens(engine, greedy_request("a", ids, 6))
        assert before == hf_greedy(hf, ids, 6)
        awake_bytes = device_bytes(engine.core)
        await engine.sleep(level)
        assert engine.is_sleeping()
        assert device_bytes(engine.core) < 0.05 * awake_bytes
        with pytest.raises(EngineError, match="asleep"):
            await tokens(engine, greedy_request("b", ids, 6))
        await engine.wake(["weights"])  # one part back: still asleep
        assert engine.is_sleeping()
        await engine.wake(["kv_cache"])
        assert not engine.is_sleeping()
        again = await asyncio.wait_for(tokens(engine, greedy_request("c", ids, 6)), TIMEOUT)
        assert again == before
    finally:
        await engine.shutdown()


async def test_requests_running_at_sleep_end_with_an_error(llama):
    model_dir, _ = llama
    engine = await engine_for(model_dir)
    try:
        stream = engine.generate(greedy_request("long", prompt(1, 10), 400))
        first = await asyncio.wait_for(stream.__anext__(), TIMEOUT)
        assert first.token_ids
        await engine.sleep(1)
        rest = [out async for out in stream]
        assert rest[-1].finish_reason == "error" and "sleep" in rest[-1].error
        assert engine.core.seqs == {}
        await engine.wake()
        await engine.wake()  # awake already: nothing to do
    finally:
        await engine.shutdown()


async def test_sleep_mode_off_is_unsupported(llama):
    model_dir, _ = llama
    engine = await engine_for(model_dir, enable_sleep_mode=False)
    try:
        with pytest.raises(Unsupported, match="--enable-sleep-mode"):
            await engine.sleep(1)
    finally:
        await engine.shutdown()


def embeds_request(rid, hf, ids, max_tokens):
    with torch.no_grad():
        rows = hf.get_input_embeddings()(torch.tensor(ids))
    req = greedy_request(rid, [], max_tokens)
    return msgspec.structs.replace(
        req,
        prompt_embeds=rows.numpy().tobytes(),
        prompt_embeds_shape=list(rows.shape),
        prompt_embeds_dtype="float32",
    )


def test_prompt_embeds_decode_as_their_token_ids_in_a_mixed_chunked_batch(llama):
    model_dir, hf = llama
    core = core_for(model_dir, enable_prompt_embeds=True, max_prefill_chunk=7)
    ids_a, ids_b = prompt(30, 37), prompt(31, 20)
    outs = run_all(
        core,
        [
            embeds_request("emb", hf, ids_a, 8),
            greedy_request("ids", ids_b, 8),
            embeds_request("emb2", hf, ids_b, 8),
        ],
    )
    assert tokens_of(outs["emb"]) == hf_greedy(hf, ids_a, 8)
    assert tokens_of(outs["ids"]) == tokens_of(outs["emb2"]) == hf_greedy(hf, ids_b, 8)
    # Never through the prefix cache: the same embeddings again compute everything.
    again = run_all(core, [embeds_request("emb3", hf, ids_a, 2)])["emb3"]
    assert again[0].cached_tokens == 0
    assert outs["emb"][-1].usage.prompt_tokens == 37


def test_bad_prompt_embeds_are_clear_errors(llama):
    model_dir, hf = llama
    core = core_for(model_dir, enable_prompt_embeds=True)
    good = embeds_request("e", hf, prompt(1, 4), 2)
    bad_shape = msgspec.structs.replace(good, prompt_embeds_shape=[2, 128])
    with pytest.raises(EngineError, match="invalid prompt_embeds"):
        core.add_request(bad_shape)
    bad_dtype = msgspec.structs.replace(good, prompt_embeds_dtype="int64")
    with pytest.raises(EngineError, match="invalid prompt_embeds"):
        core.add_request(bad_dtype)
    with_logprobs = msgspec.structs.replace(
        good, sampling=msgspec.structs.replace(good.sampling, prompt_logprobs=1)
    )
    with pytest.raises(EngineError, match="prompt_logprobs"):
        core.add_request(with_logprobs)
    assert core.seqs == {}
