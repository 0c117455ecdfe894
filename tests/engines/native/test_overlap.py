"""Overlapped steps (`--overlap on`): tokens read one step late must give exactly the
outputs of the synchronous engine. On the CPU every op is synchronous, so these tests
check the bookkeeping (placeholders, the inputs patched from the previous step's tokens,
stops and aborts one step late, blocks freed); the GPU tests run the same path on CUDA."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from stator.engines.native.overlap import PLACEHOLDER
from stator.protocols import EngineOutput, EngineRequest, SamplingOptions, StopConditions
from tests.engines.native.models import core_for, greedy_request, prompt, run_all, tokens_of


def request(
    rid: str, ids: list[int], max_tokens: int, *, stops: tuple[int, ...] = (), **sampling
) -> EngineRequest:
    return EngineRequest(
        request_id=rid,
        model="m",
        token_ids=ids,
        sampling=SamplingOptions(**{"temperature": 0.0, **sampling}),
        stop=StopConditions(max_tokens=max_tokens, stop_token_ids_hidden=list(stops)),
    )


def counting_core(model_dir, **overrides):
    """A core whose forward passes are counted (one per step that ran the model)."""
    core = core_for(model_dir, **overrides)
    calls = Counter()
    execute = core.runner.execute

    def counted(inputs):
        calls["execute"] += 1
        assert PLACEHOLDER not in inputs.input_ids.tolist(), "an input was left unpatched"
        return execute(inputs)

    core.runner.execute = counted
    return core, calls


def summary(outs: list[EngineOutput]) -> list[tuple]:
    return [
        (o.token_ids, o.finish_reason, o.stop_token_id, o.cached_tokens, o.usage, o.logprobs)
        for o in outs
    ]


@pytest.fixture(scope="module")
def workload(llama):
    """A mix that exercises every path: greedy decodes finishing by length and by a stop
    token mid-stream, chunked prefills beside decodes, a seeded sampled request, and
    requests whose sampling needs the host (logprobs, penalties: synchronous steps)."""
    model_dir, _ = llama
    free = run_all(core_for(model_dir), [greedy_request("x", prompt(3, 19), 12)])["x"]
    stop = tokens_of(free)[5]  # the request below stops there, one step late in overlap
    return model_dir, [
        request("len", prompt(1, 23), 17),
        request("stop", prompt(3, 19), 12, stops=(stop,)),
        request("long", prompt(2, 70), 9),
        request("one", prompt(4, 8), 1),
        request("seeded", prompt(5, 30), 10, temperature=1.0, top_k=20, seed=7),
        request("lp", prompt(6, 12), 6, logprobs=2),
        request("pen", prompt(7, 15), 8, presence_penalty=1.5),
    ]


@pytest.mark.parametrize("budget", [48, 8192])
def test_overlap_gives_the_synchronous_outputs(workload, budget):
    model_dir, reqs = workload
    sync, sync_calls = counting_core(model_dir, overlap="off", max_num_batched_tokens=budget)
    over, over_calls = counting_core(model_dir, overlap="on", max_num_batched_tokens=budget)
    expected = run_all(sync, reqs)
    got = run_all(over, reqs)
    for r in reqs:
        assert summary(got[r.request_id]) == summary(expected[r.request_id]), r.request_id
    assert expected["stop"][-1].finish_reason == "stop"
    assert len(tokens_of(expected["stop"])) == 5
    assert not over.seqs and not over.has_work()
    assert over.blocks.num_used_blocks == 0
    # Only a stop token costs a step: a length finish is known before its token is.
    assert sync_calls["execute"] <= over_calls["execute"] <= sync_calls["execute"] + 1


def test_overlap_only_greedy_steps_are_deferred(llama):
    """Alone, greedy requests are deferred every step; the outputs still match."""
    model_dir, _ = llama
    reqs = [greedy_request(f"g{i}", prompt(20 + i, 9 + 11 * i), 15 + i) for i in range(5)]
    expected = run_all(core_for(model_dir, overlap="off"), reqs)
    core = core_for(model_dir, overlap="on")
    deferred = 0
    for r in reqs:
        core.add_request(r)
    got: dict[str, list[EngineOutput]] = {r.request_id: [] for r in reqs}
    while core.has_work():
        for rid, out in core.step():
            got[rid].append(out)
        deferred += core._pending is not None
    assert deferred > 10
    for r in reqs:
        assert summary(got[r.request_id]) == summary(expected[r.request_id])
    assert core.blocks.num_used_blocks == 0


def test_overlap_with_preemption(llama):
    model_dir, _ = llama
    per_block = core_for(model_dir).runner.bytes_per_block()
    reqs = [
        greedy_request("t", prompt(10, 41), 24),
        greedy_request("u", prompt(15, 40), 25),
        greedy_request("v", prompt(16, 40), 25),
    ]
    outs = {}
    for mode in ("off", "on"):
        core = core_for(model_dir, overlap=mode, kv_cache_memory=str(7 * per_block))
        outs[mode] = run_all(core, reqs)
        assert core.scheduler.num_preemptions > 0
        assert core.blocks.num_used_blocks == 0
    for r in reqs:
        assert summary(outs["on"][r.request_id]) == summary(outs["off"][r.request_id])


def test_abort_while_its_token_is_pending(llama):
    model_dir, _ = llama
    core = core_for(model_dir, overlap="on")
    core.add_request(greedy_request("a", prompt(30, 20), 50))
    core.add_request(greedy_request("b", prompt(31, 25), 12))
    seen: dict[str, list[int]] = {"a": [], "b": []}
    while len(seen["a"]) < 3:
        for rid, out in core.step():
            seen[rid].extend(out.token_ids)
    assert core._pending is not None and any(s.request_id == "a" for s in core._pending.seqs)
    assert core.abort("a")
    while core.has_work():
        for rid, out in core.step():
            assert rid == "b", "an aborted request produced output"
            seen[rid].extend(out.token_ids)
    solo = run_all(core_for(model_dir), [greedy_request("b", prompt(31, 25), 12)])["b"]
    assert seen["b"] == tokens_of(solo)
    assert core.blocks.num_used_blocks == 0
    assert not core.seqs


def test_prefix_cache_stores_real_tokens_under_overlap(llama):
    """Blocks are offered to the prefix cache only once their tokens are read back."""
    model_dir, _ = llama
    core = core_for(model_dir, overlap="on")
    target = prompt(40, 20)
    first = tokens_of(run_all(core, [greedy_request("p", target, 30)])["p"])
    # A prompt running into the generated text hits the blocks stored while decoding.
    longer = target + first[:29]
    out = run_all(core, [greedy_request("q", longer, 1)])["q"]
    assert out[0].cached_tokens == 48
    assert tokens_of(out) == first[29:30]
    for block in core.blocks.blocks:
        assert PLACEHOLDER not in (block.token_ids or [])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_overlap_gives_the_synchronous_outputs(workload):
    """On CUDA the tokens really are read one step late (pinned copy + event), and decode
    steps replay CUDA graphs whose inputs are patched on the device. (A speculative row
    changes one step's batch size, and GPU matmuls are not batch-invariant to the last
    bit, so logprob values are compared to a tolerance.)"""
    model_dir, reqs = workload
    outs = {}
    for mode in ("off", "on"):
        core = core_for(model_dir, device="cuda", dtype="float32", overlap=mode)
        assert core.overlap == (mode == "on") and core.runner.graphs is not None
        outs[mode] = run_all(core, reqs)
        assert core.blocks.num_used_blocks == 0 and not core.has_work()
    for r in reqs:
        on, off = outs["on"][r.request_id], outs["off"][r.request_id]
        assert [s[:5] for s in summary(on)] == [s[:5] for s in summary(off)], r.request_id
        for a, b in zip(on, off, strict=True):
            if b.logprobs:
                assert a.logprobs[0].token_id == b.logprobs[0].token_id
                assert a.logprobs[0].logprob == pytest.approx(b.logprobs[0].logprob, abs=1e-4)
