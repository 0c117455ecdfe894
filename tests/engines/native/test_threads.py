"""The CPU thread policy: each engine step runs with the engine's intra-op thread count and
leaves the caller's own torch setting as it found it."""

from __future__ import annotations

import threading

import torch

from stator.engines.native.config import NativeConfig
from stator.engines.native.engine_core import EngineCore
from stator.engines.native.model_runner import cpu_step_threads, intra_op_threads
from tests.engines.native.models import greedy_request, prompt


def test_configured_thread_count_wins():
    assert cpu_step_threads(3) == 3


def test_default_leaves_a_core_free_and_is_at_least_one():
    n = cpu_step_threads(0)
    assert 1 <= n <= max(1, torch.get_num_threads())


def test_intra_op_threads_restores_the_callers_count():
    before = torch.get_num_threads()
    with intra_op_threads(before + 1):
        assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before


def test_intra_op_threads_restores_after_an_error():
    before = torch.get_num_threads()
    try:
        with intra_op_threads(before + 1):
            raise KeyError("boom")
    except KeyError:
        pass
    assert torch.get_num_threads() == before


def test_a_step_runs_with_the_engines_threads_and_restores_the_callers(llama):
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
