"""Sampling rules on hand-made logits, then through the engine with a real model."""

from __future__ import annotations

import math

import pytest
import torch

from stator.engines.native.request import SamplingSpec, Sequence
from stator.engines.native.sampler import Sampler
from tests.engines.native.models import core_for, greedy_request, prompt, run_all, tokens_of

V = 8


def seq(
    output: list[int] = (), prompt_ids: list[int] = (0,), seed: int | None = None, **kw
) -> Sequence:
    s = Sequence("r", [*prompt_ids, *output], len(prompt_ids), SamplingSpec(**kw), 1000)
    if seed is not None:
        s.generator = torch.Generator().manual_seed(seed)
    return s


def sample(logits: list[list[float]], seqs: list[Sequence], seed: int = 0):
    return Sampler(V, torch.device("cpu"), seed).sample(torch.tensor(logits), seqs)


LOGITS = [0.0, 1.0, 3.0, 2.5, -1.0, 0.5, 0.2, 0.1]


def test_greedy_takes_the_argmax():
    assert sample([LOGITS, LOGITS[::-1]], [seq(temperature=0), seq(temperature=0)]).token_ids == [
        2,
        5,
    ]


def test_logit_bias_and_min_tokens():
    biased = seq(temperature=0, logit_bias={7: 10.0})
    held = seq(
        temperature=0,
        min_tokens=2,
        hidden_stop_token_ids=frozenset({2}),
        stop_token_ids=frozenset({3}),
    )
    done = seq([1, 1], temperature=0, min_tokens=2, hidden_stop_token_ids=frozenset({2}))
    assert sample([LOGITS] * 3, [biased, held, done]).token_ids == [7, 1, 2]


def test_penalties():
    # Token 2 was generated twice: frequency 1.0 takes 2 off its logit (3 -> 1).
    assert sample([LOGITS], [seq([2, 2], temperature=0, frequency_penalty=1.0)]).token_ids == [3]
    # Presence counts once: 3 - 0.4 = 2.6 still beats 2.5; with 0.6 it does not.
    assert sample([LOGITS], [seq([2, 2], temperature=0, presence_penalty=0.4)]).token_ids == [2]
    assert sample([LOGITS], [seq([2], temperature=0, presence_penalty=0.6)]).token_ids == [3]
    # Repetition: positive logits of seen tokens (prompt included) are divided.
    s = seq(prompt_ids=[3], output=[2], temperature=0, repetition_penalty=4.0)
    assert sample([LOGITS], [s]).token_ids == [1]
    # Negative logits are multiplied (pushed further down).
    neg = [-5.0, -0.5, -0.6, -9, -9, -9, -9, -9]
    s = seq(prompt_ids=[1], temperature=0, repetition_penalty=2.0)
    assert sample([neg], [s]).token_ids == [2]


def test_top_k_top_p_min_p_restrict_the_candidates():
    many = 200
    draws = {
        "top_k": seq(temperature=1.0, top_k=2),
        "top_p": seq(temperature=1.0, top_p=0.5),
        "min_p": seq(temperature=1.0, min_p=0.5),
    }
    seen: dict[str, set[int]] = {k: set() for k in draws}
    sampler = Sampler(V, torch.device("cpu"), 0)
    for _ in range(many):
        out = sampler.sample(torch.tensor([LOGITS] * 3), list(draws.values())).token_ids
        for key, token in zip(draws, out, strict=True):
            seen[key].add(token)
    assert seen["top_k"] == {2, 3}
    # p(2) ~ 0.47 < 0.5, so the nucleus needs token 3 too.
    assert seen["top_p"] == {2, 3}
    # p(3)/p(2) = e^-0.5 ~ 0.61 >= 0.5, p(1)/p(2) ~ 0.14 < 0.5.
    assert seen["min_p"] == {2, 3}


def test_seeded_sampling_does_not_depend_on_the_batch():
    def run(batch_noise_seed: int, neighbours: int) -> list[int]:
        sampler = Sampler(V, torch.device("cpu"), batch_noise_seed)
        s = seq(temperature=1.0, seed=42)
        others = [seq(temperature=1.0) for _ in range(neighbours)]
        out = []
        for _ in range(20):
            out.append(
                sampler.sample(torch.tensor([LOGITS] * (neighbours + 1)), [*others, s]).token_ids[
                    -1
                ]
            )
        return out

    assert run(0, 0) == run(1, 3) == run(2, 1)
    assert len(set(run(0, 0))) > 1


def test_logprobs_are_those_of_the_raw_distribution():
    res = sample([LOGITS], [seq(temperature=0, logprobs=3, logit_bias={0: 100.0})])
    lp = res.logprobs[0]
    expected = torch.log_softmax(torch.tensor(LOGITS), -1)
    assert lp.token_id == 0 and math.isclose(lp.logprob, float(expected[0]), rel_tol=1e-5)
    assert [t.token_id for t in lp.top] == [2, 3, 1]
    assert math.isclose(lp.top[0].logprob, float(expected[2]), rel_tol=1e-5)
    assert sample([LOGITS], [seq(temperature=0)]).logprobs == [None]


# -- through the engine ------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(llama):
    return llama[0]


def test_engine_seed_is_reproducible_across_batch_composition(model_dir):
    target = greedy_request("s", prompt(20, 12), 16, temperature=1.0, seed=1234)
    alone = tokens_of(run_all(core_for(model_dir, seed=1), [target])["s"])
    crowd = [
        greedy_request(f"o{i}", prompt(21 + i, 5 + 9 * i), 12, temperature=1.0) for i in range(3)
    ]
    mixed = run_all(core_for(model_dir, seed=2), [crowd[0], target, *crowd[1:]])
    assert tokens_of(mixed["s"]) == alone
    other_seed = greedy_request("s", prompt(20, 12), 16, temperature=1.0, seed=99)
    assert tokens_of(run_all(core_for(model_dir), [other_seed])["s"]) != alone


def test_engine_logprobs_and_prompt_logprobs_match_transformers(llama):
    model_dir, hf = llama
    ids = prompt(22, 20)
    out = run_all(
        core_for(model_dir), [greedy_request("r", ids, 3, logprobs=2, prompt_logprobs=1)]
    )["r"]
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0], -1)
    first = out[0]
    assert first.prompt_logprobs[0] is None and len(first.prompt_logprobs) == len(ids)
    for pos in range(1, len(ids)):
        entry = first.prompt_logprobs[pos]
        assert entry.token_id == ids[pos]
        assert math.isclose(entry.logprob, float(ref[pos - 1, ids[pos]]), abs_tol=1e-4)
        assert len(entry.top) == 1 and entry.top[0].token_id == int(ref[pos - 1].argmax())
    chosen = first.logprobs[0]
    assert chosen.token_id == first.token_ids[0] == chosen.top[0].token_id
    assert math.isclose(chosen.logprob, float(ref[-1].max()), abs_tol=1e-4)
    assert all(o.logprobs and len(o.logprobs[0].top) == 2 for o in out)


def test_prompt_logprobs_survive_chunking(llama):
    model_dir, _ = llama
    ids = prompt(23, 30)
    whole = run_all(core_for(model_dir), [greedy_request("r", ids, 1, prompt_logprobs=0)])["r"]
    chunked = run_all(
        core_for(model_dir, max_prefill_chunk=7), [greedy_request("r", ids, 1, prompt_logprobs=0)]
    )["r"]
    a = [e.logprob for e in whole[0].prompt_logprobs[1:]]
    b = [e.logprob for e in chunked[0].prompt_logprobs[1:]]
    assert a == pytest.approx(b, abs=1e-5)


def test_stop_tokens_min_tokens_and_ignore_eos(model_dir):
    from stator.protocols import EngineRequest, SamplingOptions, StopConditions

    def req(rid: str, **stop) -> EngineRequest:
        return EngineRequest(
            request_id=rid,
            model="m",
            token_ids=prompt(24, 10),
            sampling=SamplingOptions(temperature=0.0, logit_bias={5: 100.0}),
            stop=StopConditions(max_tokens=8, **stop),
        )

    out = run_all(
        core_for(model_dir), [req("eos"), req("min", min_tokens=3), req("ign", ignore_eos=True)]
    )
    # 5 is the model's EOS (generation_config): hidden, ends the stream.
    assert tokens_of(out["eos"]) == [] and out["eos"][-1].finish_reason == "stop"
    assert out["eos"][-1].stop_token_id == 5 and out["eos"][-1].usage.completion_tokens == 1
    assert len(tokens_of(out["min"])) == 3 and 5 not in tokens_of(out["min"])
    assert out["min"][-1].usage.completion_tokens == 4
    assert tokens_of(out["ign"]) == [5] * 8 and out["ign"][-1].finish_reason == "length"
    visible = run_all(
        core_for(model_dir),
        [
            EngineRequest(
                request_id="v",
                model="m",
                token_ids=prompt(24, 10),
                sampling=SamplingOptions(temperature=0.0, logit_bias={77: 100.0}),
                stop=StopConditions(max_tokens=8, stop_token_ids=[77]),
            )
        ],
    )["v"]
    assert tokens_of(visible) == [77] and visible[-1].stop_token_id == 77


def test_engine_penalties_avoid_repeats(model_dir):
    ids = prompt(25, 10)
    out = run_all(core_for(model_dir), [greedy_request("r", ids, 12, repetition_penalty=50.0)])["r"]
    toks = tokens_of(out)
    assert len(set(toks)) == len(toks) and not set(toks) & set(ids)
