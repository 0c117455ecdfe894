"""The CPU thread policy: each step runs on the engine's chosen intra-op thread count
(fixed, or measured between two counts) and leaves the caller's own setting as it was."""

from __future__ import annotations

import threading

import torch

from stator.engines.native.config import NativeConfig
from stator.engines.native.cpu_threads import StepThreads, intra_op_threads
from stator.engines.native.engine_core import EngineCore
from tests.engines.native.models import greedy_request, prompt


def feed(policy: StepThreads, cost: dict[int, float], steps: int) -> list[int]:
    """Run `steps` decode steps where count n costs cost[n] seconds; the counts picked."""
    picked = []
    for _ in range(steps):
        n = policy.pick(decode=True)
        picked.append(n)
        policy.record(True, n, cost[n] * 16, 16)
    return picked


def test_a_configured_count_is_the_only_candidate():
    policy = StepThreads(3, widest=8)
    assert policy.candidates == [3]
    assert set(feed(policy, {3: 1.0}, 20)) == {3}


def test_default_candidates_are_the_widest_count_and_half():
    assert StepThreads(0, widest=8).candidates == [8, 4]
    assert StepThreads(0, widest=2).candidates == [2, 1]
    assert StepThreads(0, widest=1).candidates == [1]
    assert 1 <= StepThreads(0).candidates[-1] <= StepThreads(0).candidates[0]


def test_settles_on_the_faster_count_and_probes_the_other_rarely():
    picked = feed(StepThreads(0, widest=2), {2: 1.0, 1: 3.0}, 300)
    assert picked[:2] == [2, 1]  # each tried once
    assert picked[2:].count(1) <= 6  # probes back off
    picked = feed(StepThreads(0, widest=2), {2: 3.0, 1: 1.0}, 300)
    assert picked[2:].count(2) <= 6


def test_switches_when_load_slows_the_current_count():
    policy = StepThreads(0, widest=2)
    feed(policy, {2: 1.0, 1: 1.5}, 50)
    assert policy.pick(decode=True) == 2
    picked = feed(policy, {2: 10.0, 1: 1.5}, 20)  # another process takes a core
    switched = picked.index(1)
    assert switched <= 2  # within a few steps, not at the next probe
    assert picked[switched:].count(2) <= 1  # then at most one probe of the slow count


def test_one_slow_step_does_not_move_it_off_the_faster_count():
    policy = StepThreads(0, widest=2)
    feed(policy, {2: 1.0, 1: 1.3}, 50)
    assert policy.pick(decode=True) == 2
    policy.record(True, 2, 2.5 * 16, 16)  # a hiccup: one step 2.5x slower
    assert policy.pick(decode=True) == 2


def test_decode_and_prefill_are_measured_apart():
    policy = StepThreads(0, widest=2)
    feed(policy, {2: 3.0, 1: 1.0}, 5)
    assert policy.pick(decode=True) == 1
    assert policy.pick(decode=False) == 2  # prefill: untried, starts from the widest


def test_intra_op_threads_restores_the_callers_count_even_after_an_error():
    before = torch.get_num_threads()
    with intra_op_threads(before + 1):
        assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before
    try:
        with intra_op_threads(before + 1):
            raise KeyError("boom")
    except KeyError:
        pass
    assert torch.get_num_threads() == before


def test_a_step_runs_on_the_engines_count_and_restores_the_callers(llama):
    model_dir, _ = llama
    config = NativeConfig(device="cpu", dtype="float32", kv_cache_memory="4MiB", cpu_threads=2)
    core = EngineCore(config, model_dir)
    seen: list[int] = []
    execute = core.runner.execute

    def spy(inputs):
        seen.append(torch.get_num_threads())
        return execute(inputs)

    core.runner.execute = spy  # type: ignore[method-assign]
    before = torch.get_num_threads()  # 1: set by this package's conftest
    core.add_request(greedy_request("a", prompt(1, 10), 2))
    while core.has_work():
        core.step()
    assert seen and set(seen) == {2}
    assert torch.get_num_threads() == before


def test_the_count_is_per_thread():
    """OpenMP keeps the count per thread: a step thread's setting does not leak out."""
    before = torch.get_num_threads()
    inside: list[int] = []

    def work():
        torch.set_num_threads(before + 1)
        inside.append(torch.get_num_threads())

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert inside == [before + 1]
    assert torch.get_num_threads() == before


def test_tokens_do_not_depend_on_the_thread_count(llama):
    model_dir, _ = llama
    outputs = []
    for threads in (1, 2):
        config = NativeConfig(
            device="cpu", dtype="float32", kv_cache_memory="4MiB", cpu_threads=threads
        )
        core = EngineCore(config, model_dir)
        for i in range(4):
            core.add_request(greedy_request(f"r{i}", prompt(i, 12 + 3 * i), 8))
        tokens: dict[str, list[int]] = {}
        while core.has_work():
            for rid, out in core.step():
                tokens.setdefault(rid, []).extend(out.token_ids)
        outputs.append(tokens)
    assert outputs[0] == outputs[1]
