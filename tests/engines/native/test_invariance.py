"""Greedy output must not depend on how the engine batched, paged, cached or chunked it."""

from __future__ import annotations

import pytest

from tests.engines.native.models import core_for, greedy_request, prompt, run_all, tokens_of

STEPS = 24


@pytest.fixture(scope="module")
def setup(llama):
    model_dir, _ = llama
    target = prompt(10, 41)  # 2 full blocks of 16 and a partial one
    alone = tokens_of(run_all(core_for(model_dir), [greedy_request("t", target, STEPS)])["t"])
    return model_dir, target, alone


def test_alone_vs_inside_a_mixed_batch(setup):
    model_dir, target, alone = setup
    others = [
        greedy_request("a", prompt(11, 5), 30),
        greedy_request("b", prompt(12, 70), 10),
        greedy_request("c", prompt(13, 17), 20, temperature=1.0, seed=3),
    ]
    core = core_for(model_dir, max_num_batched_tokens=48)
    out = run_all(core, [*others[:2], greedy_request("t", target, STEPS), others[2]])
    assert tokens_of(out["t"]) == alone


def test_block_size_64(setup):
    model_dir, target, alone = setup
    out = run_all(core_for(model_dir, block_size=64), [greedy_request("t", target, STEPS)])
    assert tokens_of(out["t"]) == alone


@pytest.mark.parametrize("chunk", [1, 7, 64, 0])
def test_chunked_prefill(setup, chunk):
    model_dir, target, alone = setup
    core = core_for(model_dir, max_prefill_chunk=chunk)
    # A decoding neighbour shares every step with the chunks.
    out = run_all(
        core, [greedy_request("n", prompt(14, 9), 40), greedy_request("t", target, STEPS)]
    )
    assert tokens_of(out["t"]) == alone


def test_prefix_cache_hit(setup):
    model_dir, target, alone = setup
    core = core_for(model_dir)
    first = run_all(core, [greedy_request("t1", target, STEPS)])["t1"]
    second = run_all(core, [greedy_request("t2", target, STEPS)])["t2"]
    assert first[0].cached_tokens == 0
    assert second[0].cached_tokens == 32  # the two full prompt blocks
    assert second[-1].usage.cached_tokens == 32
    assert tokens_of(first) == tokens_of(second) == alone
    # A prompt that extends into generated text hits blocks stored while decoding.
    longer = target + alone[:20]
    third = run_all(core, [greedy_request("t3", longer, 4)])["t3"]
    assert third[0].cached_tokens == 48
    assert tokens_of(third) == alone[20:24]


def test_without_prefix_caching_nothing_is_cached(setup):
    model_dir, target, alone = setup
    core = core_for(model_dir, enable_prefix_caching=False)
    run_all(core, [greedy_request("t1", target, STEPS)])
    out = run_all(core, [greedy_request("t2", target, STEPS)])["t2"]
    assert out[0].cached_tokens == 0
    assert tokens_of(out) == alone


def test_forced_preemption_recomputes_the_same_tokens(setup):
    model_dir, target, alone = setup
    # 7 blocks of 16 tokens: two 65-token sequences need 8, so one is preempted.
    core = core_for(
        model_dir, kv_cache_memory=str(7 * core_for(model_dir).runner.bytes_per_block())
    )
    assert core.blocks.num_blocks == 7
    requests = [greedy_request("t", target, STEPS), greedy_request("u", prompt(15, 40), 25)]
    requests.append(greedy_request("v", prompt(16, 40), 25))
    out = run_all(core, requests)
    assert core.scheduler.num_preemptions > 0
    assert tokens_of(out["t"]) == alone
    for rid in ("u", "v"):
        solo = run_all(core_for(model_dir), [r for r in requests if r.request_id == rid])
        assert tokens_of(out[rid]) == tokens_of(solo[rid])
    assert core.blocks.num_used_blocks == 0


def test_continuous_decode_steps_delay_a_prompt_not_its_tokens(setup):
    model_dir, target, alone = setup
    assert core_for(model_dir).scheduler.num_continuous_decode_steps == 1  # auto, on the CPU
    core = core_for(model_dir, num_continuous_decode_steps=4)
    core.add_request(greedy_request("n", prompt(14, 9), 40))
    core.step()  # n prefills alone
    core.add_request(greedy_request("t", target, STEPS))
    steps_to_first, outputs = 0, []
    while core.has_work():
        steps_to_first += not outputs
        outputs += [out for rid, out in core.step() if rid == "t"]
    assert steps_to_first == 4  # 3 steps of n alone, then t's prefill
    assert tokens_of(outputs) == alone
