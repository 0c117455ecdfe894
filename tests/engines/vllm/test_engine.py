"""The vLLM engine at engine level, on a tiny random Llama: one engine for the module."""

from __future__ import annotations

import asyncio

import pytest

from tests.engines.vllm.conftest import SKIP_REASON

pytest.importorskip("vllm", reason=SKIP_REASON)

import pytest_asyncio
from tokenizers import Tokenizer

from stator.engines.base import EngineError, Unsupported
from stator.engines.vllm import VllmConfig, create_engine
from stator.protocols import (
    AllCleared,
    BlockStored,
    EngineRequest,
    GuidedDecoding,
    SamplingOptions,
    StopConditions,
)
from tests.engines.vllm.helpers import (
    TEST_ENGINE_ARGS,
    collect,
    greedy_request,
    tokens,
)
from tests.engines.vllm.models import HIDDEN

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

PROMPT_TEXT = "def hello(name):\n    return f'hello {name}'\n"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(llama_dir):
    config = VllmConfig.make(
        {
            **TEST_ENGINE_ARGS,
            "enable_lora": True,
            "max_lora_rank": 8,
            "max_loras": 2,
            "enable_prompt_embeds": True,
        },
        engine_monitor_interval=1.0,
    )
    eng = create_engine(config, str(llama_dir), "tiny")
    eng.worker_id = 7
    await eng.start()
    yield eng
    await eng.shutdown()


@pytest.fixture(scope="module")
def tokenizer(llama_dir) -> Tokenizer:
    return Tokenizer.from_file(str(llama_dir / "tokenizer.json"))


@pytest.fixture(scope="module")
def prompt(tokenizer) -> list[int]:
    return tokenizer.encode(PROMPT_TEXT).ids


def long_prompt(tokenizer, n: int) -> list[int]:
    ids: list[int] = []
    i = 0
    while len(ids) < n:
        ids += tokenizer.encode(f"value_{i} = compute({i}, key='k{i}')\n").ids
        i += 1
    return ids[:n]


async def test_card_has_vllm_real_sizes(engine):
    card = engine.model_card()
    cfg = engine.llm.vllm_config
    assert card.engine == "vllm"
    assert card.context_length == 1024
    assert card.kv_block_size == cfg.cache_config.block_size > 0
    assert card.total_kv_blocks == cfg.cache_config.num_gpu_blocks > 0
    assert card.max_num_seqs == cfg.scheduler_config.max_num_seqs
    assert card.max_num_batched_tokens == cfg.scheduler_config.max_num_batched_tokens
    assert 5 in card.eos_token_ids  # <|im_end|> of the test tokenizer
    # --enable-prompt-embeds: the frontend checks embeddings against this width.
    assert card.prompt_embeds_hidden_size == HIDDEN
    # vLLM cannot list its cached blocks: routers are told not to ask, and asking fails.
    assert card.kv_state_available is False
    with pytest.raises(Unsupported, match="no KV state dump"):
        engine.kv_state()


async def test_streams_deltas_identical_to_offline_generate(
    engine, llama_dir, prompt, offline_vllm
):
    outputs = await collect(engine.generate(greedy_request("stream-1", prompt, max_tokens=12)))
    assert len(outputs) > 1, "expected a stream of deltas, not one output"
    assert all(o.finish_reason is None for o in outputs[:-1])
    last = outputs[-1]
    assert last.finish_reason == "length"
    assert last.usage is not None
    assert last.usage.prompt_tokens == len(prompt)
    assert last.usage.completion_tokens == 12
    got = tokens(outputs)
    assert len(got) == 12
    # As the engine under test: prompt embeddings enabled (test_e2e's reference too).
    expected = await asyncio.to_thread(
        offline_vllm.greedy, llama_dir, prompt, 12, prompt_embeds=True
    )
    assert got == expected


async def test_logprobs(engine, prompt):
    request = greedy_request("lp-1", prompt, max_tokens=4, logprobs=2)
    outputs = await collect(engine.generate(request))
    entries = [lp for o in outputs for lp in (o.logprobs or [])]
    assert [e.token_id for e in entries] == tokens(outputs)
    for entry in entries:
        assert len(entry.top) == 2
        assert entry.top[0].token_id == entry.token_id  # greedy picks the best token
        assert entry.logprob == pytest.approx(entry.top[0].logprob)
        assert entry.top[0].logprob >= entry.top[1].logprob


async def test_prompt_logprobs_refused_with_lora_on_cpu(engine, prompt):
    # vLLM's CPU LoRA kernels die on prompt_logprobs in a batch (see engine.py); the
    # prompt-logprobs path itself is tested on the LoRA-free engine of test_engine_death.
    request = greedy_request("plp-1", prompt, max_tokens=2, prompt_logprobs=1)
    with pytest.raises(EngineError, match="prompt_logprobs"):
        await collect(engine.generate(request))


async def test_visible_and_hidden_stop_tokens(engine, prompt):
    free = tokens(await collect(engine.generate(greedy_request("stop-0", prompt, max_tokens=6))))
    target = free[2]
    cut = free.index(target)
    visible = EngineRequest(
        request_id="stop-visible",
        model="tiny",
        token_ids=prompt,
        sampling=SamplingOptions(temperature=0.0),
        stop=StopConditions(max_tokens=6, stop_token_ids=[target], ignore_eos=True),
    )
    out = await collect(engine.generate(visible))
    assert tokens(out) == free[: cut + 1]
    assert out[-1].finish_reason == "stop" and out[-1].stop_token_id == target
    hidden = EngineRequest(
        request_id="stop-hidden",
        model="tiny",
        token_ids=prompt,
        sampling=SamplingOptions(temperature=0.0),
        stop=StopConditions(max_tokens=6, stop_token_ids_hidden=[target]),
    )
    out = await collect(engine.generate(hidden))
    assert tokens(out) == free[:cut]
    assert out[-1].finish_reason == "stop" and out[-1].stop_token_id == target
    # min_tokens holds the stop back.
    held = EngineRequest(
        request_id="stop-min",
        model="tiny",
        token_ids=prompt,
        sampling=SamplingOptions(temperature=0.0),
        stop=StopConditions(max_tokens=6, min_tokens=6, stop_token_ids=[target], ignore_eos=True),
    )
    out = await collect(engine.generate(held))
    assert len(tokens(out)) == 6


async def test_seeded_sampling_is_reproducible(engine, prompt):
    def req(rid: str) -> EngineRequest:
        return EngineRequest(
            request_id=rid,
            model="tiny",
            token_ids=prompt,
            sampling=SamplingOptions(temperature=1.0, top_k=50, seed=1234),
            stop=StopConditions(max_tokens=8, ignore_eos=True),
        )

    first = tokens(await collect(engine.generate(req("seed-1"))))
    second = tokens(await collect(engine.generate(req("seed-2"))))
    assert first == second


async def test_structured_output_choice(engine, prompt, tokenizer):
    request = EngineRequest(
        request_id="guided-1",
        model="tiny",
        token_ids=prompt,
        sampling=SamplingOptions(
            temperature=0.0, guided_decoding=GuidedDecoding(choice=["alpha", "beta"])
        ),
        stop=StopConditions(max_tokens=10, stop_token_ids_hidden=[5]),
    )
    outputs = await collect(engine.generate(request))
    text = tokenizer.decode(tokens(outputs))
    assert text in ("alpha", "beta")


async def test_close_stream_aborts_vllm_request(engine, prompt):
    stream = engine.generate(greedy_request("cancel-1", prompt, max_tokens=900))
    seen = 0
    async for _ in stream:
        seen += 1
        if seen == 2:
            break
    await stream.aclose()
    processor = engine.llm.output_processor
    for _ in range(100):
        if processor.get_num_unfinished_requests() == 0:
            break
        await asyncio.sleep(0.05)
    assert processor.get_num_unfinished_requests() == 0


async def test_abort_by_id_finishes_stream(engine, prompt):
    request = greedy_request("cancel-2", prompt, max_tokens=900)
    outputs = []

    async def consume():
        async for out in engine.generate(request):
            outputs.append(out)
            if len(outputs) == 2:
                await engine.abort("cancel-2")

    await asyncio.wait_for(consume(), timeout=60)
    assert outputs[-1].finish_reason == "abort"
    assert len(tokens(outputs)) < 900
    assert engine.llm.output_processor.get_num_unfinished_requests() == 0


async def test_prefix_cache_hit_reported_and_kv_events_relayed(engine, tokenizer):
    block = engine.model_card().kv_block_size
    shared = long_prompt(tokenizer, 2 * block + 20)
    events_seen: list = []

    async def watch():
        async for batch in engine.kv_events():
            events_seen.extend(batch)

    watcher = asyncio.create_task(watch())
    try:
        await engine.clear_kv()
        first = await collect(engine.generate(greedy_request("pc-1", shared, max_tokens=2)))
        assert first[0].cached_tokens == 0
        second = await collect(
            engine.generate(greedy_request("pc-2", [*shared[:-5], 10, 11, 12], max_tokens=2))
        )
        assert second[0].cached_tokens >= 2 * block
        assert second[-1].usage.cached_tokens == second[0].cached_tokens

        def relayed() -> bool:
            cleared = any(isinstance(e.data, AllCleared) for e in events_seen)
            stored = [e.data for e in events_seen if isinstance(e.data, BlockStored)]
            return cleared and any(s.token_ids[:block] == shared[:block] for s in stored)

        for _ in range(200):
            if relayed() or watcher.done():
                break
            await asyncio.sleep(0.05)
        if watcher.done():
            watcher.result()  # surfaces a relay failure
        kinds = [type(e.data).__name__ for e in events_seen]
        assert any(isinstance(e.data, AllCleared) for e in events_seen), kinds
        stored = [e.data for e in events_seen if isinstance(e.data, BlockStored)]
        mine = [s for s in stored if s.token_ids[:block] == shared[:block]]
        assert mine, f"no BlockStored with the prompt's tokens among {len(stored)} events"
        assert mine[0].block_size == block
        assert len(mine[0].token_ids) == block * len(mine[0].block_hashes)
        ids = [e.event_id for e in events_seen]
        assert ids == list(range(ids[0], ids[0] + len(ids)))
        assert all(e.worker_id == 7 for e in events_seen)
    finally:
        watcher.cancel()


async def test_lora_load_use_unload(engine, prompt, lora_dir):
    base = tokens(await collect(engine.generate(greedy_request("lora-base-1", prompt))))
    info = await engine.load_lora("ad1", f"file://{lora_dir}")
    assert info.name == "ad1" and info.base_model == "tiny"
    assert [i.name for i in engine.list_loras()] == ["ad1"]
    assert [i.name for i in engine.model_card().loras] == ["ad1"]
    # max_loras=2 keeps one slot free for the base model (the vLLM CPU bug guard).
    with pytest.raises(EngineError, match="max_loras"):
        await engine.load_lora("ad2", str(lora_dir))
    request = greedy_request("lora-1", prompt)
    request.lora_name = "ad1"
    adapted = tokens(await collect(engine.generate(request)))
    assert adapted != base
    # Base and adapter batched together: the base request stays the base model's.
    base_again, adapted_again = await asyncio.gather(
        collect(engine.generate(greedy_request("lora-base-2", prompt))),
        collect(engine.generate(request_with_lora("lora-2", prompt, "ad1"))),
    )
    assert tokens(base_again) == base
    assert tokens(adapted_again) == adapted
    await engine.unload_lora("ad1")
    assert engine.list_loras() == []
    with pytest.raises(EngineError, match="not loaded"):
        await collect(engine.generate(request_with_lora("lora-3", prompt, "ad1")))


def request_with_lora(rid: str, prompt: list[int], name: str) -> EngineRequest:
    request = greedy_request(rid, prompt)
    request.lora_name = name
    return request


async def test_lora_bad_source_is_refused(engine, tmp_path):
    with pytest.raises(EngineError, match="adapter"):
        await engine.load_lora("nope", str(tmp_path))
    with pytest.raises(EngineError, match="file://"):
        await engine.load_lora("nope", "s3://bucket/adapter")


async def test_prompt_embeds_match_token_ids(engine, prompt, llama_dir):
    from safetensors.torch import load_file

    weights = load_file(str(llama_dir / "model.safetensors"))
    table = weights["model.embed_tokens.weight"]
    embeds = table[prompt].float().contiguous()
    request = EngineRequest(
        request_id="embeds-1",
        model="tiny",
        prompt_embeds=embeds.numpy().tobytes(),
        prompt_embeds_shape=list(embeds.shape),
        prompt_embeds_dtype="float32",
        sampling=SamplingOptions(temperature=0.0),
        stop=StopConditions(max_tokens=8, ignore_eos=True),
    )
    outputs = await collect(engine.generate(request))
    by_ids = tokens(await collect(engine.generate(greedy_request("embeds-2", prompt))))
    assert tokens(outputs) == by_ids
    assert outputs[-1].usage.prompt_tokens == len(prompt)
    bad = EngineRequest(
        request_id="embeds-bad",
        model="tiny",
        prompt_embeds=b"\0" * 12,
        prompt_embeds_shape=[1, 3],
        prompt_embeds_dtype="float32",
    )
    with pytest.raises(EngineError, match="hidden size"):
        await collect(engine.generate(bad))


async def test_bad_requests_get_clear_errors(engine, prompt):
    with pytest.raises(EngineError, match="neither token_ids"):
        await collect(engine.generate(EngineRequest(request_id="bad-1", model="tiny")))
    with pytest.raises(EngineError, match="n=2"):
        await collect(engine.generate(greedy_request("bad-2", prompt, n=2)))
    with pytest.raises(EngineError, match="sampling"):
        await collect(engine.generate(greedy_request("bad-3", prompt, top_p=7.0)))
    too_long = list(prompt) * 200
    with pytest.raises(EngineError):
        await collect(engine.generate(greedy_request("bad-4", too_long[:1500])))


async def test_sleep_refused_on_cpu(engine):
    with pytest.raises(Unsupported, match="sleep mode"):
        await engine.sleep(1)
    with pytest.raises(Unsupported, match="sleep mode"):
        await engine.wake()


async def test_metrics_and_load_come_from_vllm(engine, prompt):
    await collect(engine.generate(greedy_request("metrics-1", prompt)))
    metrics = engine.metrics()
    assert metrics.get("vllm_prompt_tokens_total", 0) > 0
    assert "vllm_num_requests_running" in metrics
    (report,) = engine.load()
    assert report.worker_id == 7
    assert report.total_kv_blocks == engine.model_card().total_kv_blocks


async def test_health_check_passes(engine):
    await engine.health_check()
